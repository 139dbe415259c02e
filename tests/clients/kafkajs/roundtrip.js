// Produces N records to a new topic, reads them back through a consumer group, and prints the values read as
// JSON. The connection settings come as one JSON argument: {brokers, topic, n, ssl?: {ca, cert?, key?},
// sasl?: {mechanism, username, password}}. Exit status 1 with the error on stderr when anything fails.
const fs = require("fs");
const { Kafka, logLevel } = require("kafkajs");

async function main() {
  const spec = JSON.parse(process.argv[2]);
  let ssl = false;
  if (spec.ssl) {
    ssl = { ca: [fs.readFileSync(spec.ssl.ca, "utf8")], rejectUnauthorized: true };
    if (spec.ssl.cert) {
      ssl.cert = fs.readFileSync(spec.ssl.cert, "utf8");
      ssl.key = fs.readFileSync(spec.ssl.key, "utf8");
    }
  }
  const kafka = new Kafka({ clientId: "kafkajs-test", brokers: spec.brokers, ssl, sasl: spec.sasl,
                            logLevel: logLevel.ERROR, retry: { retries: 5 } });
  const producer = kafka.producer({ allowAutoTopicCreation: true, idempotent: true });
  await producer.connect();
  const messages = [];
  for (let i = 0; i < spec.n; i++) messages.push({ value: `v${i}` });
  await producer.send({ topic: spec.topic, acks: -1, messages });
  await producer.disconnect();

  const consumer = kafka.consumer({ groupId: `g-${spec.topic}` });
  await consumer.connect();
  await consumer.subscribe({ topic: spec.topic, fromBeginning: true });
  const got = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`read ${got.length} of ${spec.n} records in 30 s`)), 30000);
    consumer.run({
      eachMessage: async ({ message }) => {
        got.push(message.value.toString());
        if (got.length >= spec.n) { clearTimeout(timer); resolve(); }
      },
    }).catch(reject);
  });
  await consumer.disconnect();
  process.stdout.write(JSON.stringify(got));
}

main().catch((e) => { process.stderr.write(`${e.stack || e}\n`); process.exit(1); });
