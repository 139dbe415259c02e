package io.kafscale.streams;

import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.Stores;

/**
 * A word count with Kafka Streams, exactly once (processing.guarantee=exactly_once_v2), for
 * tests/jvm/test_streams_eos.py:
 *
 * <pre>
 * java -cp build/streams-4.4.0:lib/streams-4.4.0/* io.kafscale.streams.WordCount BOOTSTRAP APP_ID INPUT OUTPUT
 *      STATE_DIR [rocksdb|memory] [key=value ...]
 * </pre>
 *
 * Input: lines (string values, keys ignored). Output: word -> its count so far (string key, long value), through
 * a repartition topic (groupBy word) and a key-value store whose changelog Streams creates and writes in the same
 * transactions. The trailing key=value pairs are more StreamsConfig settings (they win).
 *
 * Prints "STATE <new state>" on each state change, so a caller can wait for RUNNING, and "ERROR ..." on an
 * uncaught exception (the app then shuts down with exit code 1).
 */
public final class WordCount {
    private WordCount() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: WordCount BOOTSTRAP APP_ID INPUT OUTPUT STATE_DIR [rocksdb|memory] [k=v ...]");
            System.exit(2);
        }
        String input = args[2];
        String output = args[3];
        boolean inMemory = args.length > 5 && "memory".equals(args[5]);

        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
        props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.String().getClass());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.String().getClass());
        // Streams creates its internal topics itself: the repartition topic, and the store's changelog with
        // cleanup.policy=compact, which the broker cleans while the app runs (a restore then reads the latest
        // count of each word, across the ranges a cleaning removed).
        // A restarted instance should not wait long for its killed predecessor: the group notices the dead member
        // after session.timeout.ms (6 s, the broker's minimum by default), and a transaction the dead producer
        // left open is aborted after transaction.timeout.ms (unless the new instance takes over its
        // transactional.id, which aborts it at once).
        props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
        props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 1000);
        props.put(StreamsConfig.producerPrefix("transaction.timeout.ms"), 10000);
        props.put(StreamsConfig.consumerPrefix("auto.offset.reset"), "earliest");
        for (int i = 6; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            props.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }

        StreamsBuilder builder = new StreamsBuilder();
        Materialized<String, Long, KeyValueStore<Bytes, byte[]>> store = inMemory
                ? Materialized.<String, Long>as(Stores.inMemoryKeyValueStore("counts"))
                : Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts");
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\W+")))
                .filter((key, word) -> !word.isEmpty())
                .groupBy((key, word) -> word, Grouped.with("words", Serdes.String(), Serdes.String()))
                .count(store.withKeySerde(Serdes.String()).withValueSerde(Serdes.Long()))
                .toStream()
                .to(output, Produced.with(Serdes.String(), Serdes.Long()));

        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        CountDownLatch done = new CountDownLatch(1);
        int[] exit = {0};
        streams.setStateListener((now, before) -> {
            System.out.println("STATE " + now);
            System.out.flush();
            if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
                done.countDown();
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            System.out.println("ERROR " + e);
            System.out.flush();
            exit[0] = 1;
            return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
                    .SHUTDOWN_CLIENT;
        });
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            streams.close();
            done.countDown();
        }));
        streams.start();
        done.await();
        streams.close();
        System.exit(exit[0]);
    }
}
