//! rskafka (a pure-Rust Kafka client, no librdkafka) against a broker: create a topic, produce batches of records
//! in every codec to each of its partitions, list offsets, fetch everything back; prints one JSON object.
//!
//!     rskafka-roundtrip '{"bootstrap": "127.0.0.1:9092", "topic": "t", "partitions": 2, "batch": 10}'
//!
//! Record i of partition p (counted over the partition's batches) is key `k-<p>-<i>`, value `v-<p>-<i>` (every
//! 7th value null), one header `h` = `<i>`, timestamp `base_ms + i`. The caller (tests/integration/
//! test_go_rust_clients.py) checks what comes back against that.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use rskafka::client::partition::{Compression, OffsetAt, UnknownTopicHandling};
use rskafka::client::ClientBuilder;
use rskafka::record::Record;
use serde_json::{json, Value};

const CODECS: [(&str, Compression); 5] = [
    ("none", Compression::NoCompression),
    ("gzip", Compression::Gzip),
    ("snappy", Compression::Snappy),
    ("lz4", Compression::Lz4),
    ("zstd", Compression::Zstd),
];

fn record(partition: i32, i: i64, base_ms: i64) -> Record {
    let mut headers = BTreeMap::new();
    headers.insert("h".to_string(), i.to_string().into_bytes());
    Record {
        key: Some(format!("k-{partition}-{i}").into_bytes()),
        value: if i % 7 == 6 {
            None
        } else {
            Some(format!("v-{partition}-{i}").into_bytes())
        },
        headers,
        timestamp: DateTime::<Utc>::from_timestamp_millis(base_ms + i).expect("timestamp"),
    }
}

fn text(bytes: &Option<Vec<u8>>) -> Value {
    match bytes {
        Some(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        None => Value::Null,
    }
}

async fn run(spec: &Value) -> Result<Value, Box<dyn std::error::Error>> {
    let bootstrap = spec["bootstrap"]
        .as_str()
        .ok_or("no bootstrap")?
        .to_string();
    let topic = spec["topic"].as_str().ok_or("no topic")?.to_string();
    let partitions = spec["partitions"].as_i64().unwrap_or(1) as i32;
    let batch = spec["batch"].as_i64().unwrap_or(10);
    let base_ms = spec["base_ms"].as_i64().unwrap_or(1_700_000_000_000);

    let client = ClientBuilder::new(bootstrap.split(',').map(str::to_string).collect())
        .client_id("kafscale-rskafka")
        .build()
        .await?;
    client
        .controller_client()?
        .create_topic(&topic, partitions, 1, 10_000)
        .await?;
    // A new topic reaches every broker's metadata cache a little later (Kafka's): list until it is there.
    let mut listed: Vec<Value> = Vec::new();
    for _ in 0..100 {
        listed = client
            .list_topics()
            .await?
            .into_iter()
            .filter(|t| t.name == topic)
            .map(|t| json!({"name": t.name, "partitions": t.partitions.into_iter().collect::<Vec<_>>()}))
            .collect();
        if !listed.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let mut out = Vec::new();
    for p in 0..partitions {
        let pc = client
            .partition_client(topic.as_str(), p, UnknownTopicHandling::Retry)
            .await?;
        let mut produced = Vec::new(); // [codec, [offsets]] per batch
        let mut i = 0i64;
        for (name, codec) in CODECS {
            let records: Vec<Record> = (i..i + batch).map(|n| record(p, n, base_ms)).collect();
            i += batch;
            let offsets = pc.produce(records, codec).await?;
            produced.push(json!({"codec": name, "offsets": offsets}));
        }
        let earliest = pc.get_offset(OffsetAt::Earliest).await?;
        let latest = pc.get_offset(OffsetAt::Latest).await?;

        let mut fetched = Vec::new();
        let mut next = earliest;
        let mut high_watermark = -1;
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while next < latest {
            if std::time::Instant::now() > deadline {
                return Err(
                    format!("partition {p}: fetched up to {next} of {latest} in 30 s").into(),
                );
            }
            let (records, hw) = pc.fetch_records(next, 1..1_000_000, 500).await?;
            high_watermark = hw;
            for r in records {
                if r.offset < next {
                    continue; // a fetch returns whole batches: the start of one already read
                }
                next = r.offset + 1;
                let headers: BTreeMap<String, Value> = r
                    .record
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), text(&Some(v.clone()))))
                    .collect();
                fetched.push(json!({
                    "offset": r.offset,
                    "key": text(&r.record.key),
                    "value": text(&r.record.value),
                    "headers": headers,
                    "timestamp": r.record.timestamp.timestamp_millis(),
                }));
            }
        }
        out.push(json!({
            "partition": p, "produced": produced, "earliest": earliest, "latest": latest,
            "high_watermark": high_watermark, "records": fetched,
        }));
    }
    Ok(json!({"client": "rskafka", "topics": listed, "partitions": out}))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let arg = std::env::args()
        .nth(1)
        .expect("usage: rskafka-roundtrip JSON-SPEC");
    let spec: Value = serde_json::from_str(&arg).expect("spec is JSON");
    let timeout = Duration::from_secs(spec["timeout_s"].as_u64().unwrap_or(60));
    match tokio::time::timeout(timeout, run(&spec)).await {
        Ok(Ok(result)) => println!("{result}"),
        Ok(Err(e)) => {
            println!("{}", json!({"client": "rskafka", "error": e.to_string()}));
            std::process::exit(1);
        }
        Err(_) => {
            println!(
                "{}",
                json!({"client": "rskafka", "error": format!("timed out after {timeout:?}")})
            );
            std::process::exit(1);
        }
    }
}
