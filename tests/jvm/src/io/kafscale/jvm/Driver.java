package io.kafscale.jvm;

import java.io.ByteArrayOutputStream;
import java.io.InputStream;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Pattern;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.ConsumerGroupListing;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeUserScramCredentialsResult;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Drives Apache Kafka's Java client (whichever kafka-clients jar it was compiled against and runs with) through a
 * scenario read as JSON on standard input, and prints one line per step, {@code RESULT <json>}, on standard
 * output. The tests of tests/jvm write the scenarios and assert on the results.
 *
 * <pre>
 * {"config": {"bootstrap.servers": "127.0.0.1:9092", ...every client's settings},
 *  "steps": [{"op": "produce", "topic": "t", "count": 10, "config": {"acks": "all"}}, ...]}
 * </pre>
 *
 * A step that throws answers {"error": "SimpleClassName", "message": "..."} (the cause of an ExecutionException)
 * and the next step runs; one with "retry_ms" is tried again until it succeeds (or fails with the error named by
 * "until_error") or that much time has passed.
 * Consumers opened by "open" live across steps, by name, so several can be polled in turn from this one thread
 * (a group with members joining and leaving); admin clients are kept per settings.
 * Only what every client from 2.8 to 4.x has is called directly; the rest goes through {@link #call}.
 */
public final class Driver {
    private static final long TIMEOUT_S = 30;

    private final Map<String, Object> base;
    private final Map<String, Member> members = new LinkedHashMap<>();
    private final Map<String, Admin> admins = new HashMap<>();

    private Driver(Map<String, Object> base) {
        this.base = base;
    }

    public static void main(String[] args) throws Exception {
        String text = new String(readAll(System.in), StandardCharsets.UTF_8);
        Map<String, Object> scenario = map(Json.parse(text));
        Driver driver = new Driver(map(scenario.getOrDefault("config", new LinkedHashMap<>())));
        PrintStream out = System.out;
        int index = 0;
        try {
            for (Object raw : list(scenario.get("steps"))) {
                Map<String, Object> step = map(raw);
                Map<String, Object> result = new LinkedHashMap<>();
                result.put("step", index++);
                result.put("op", step.get("op"));
                long began = System.nanoTime();
                long deadline = System.currentTimeMillis() + ((Number) step.getOrDefault("retry_ms", 0L)).longValue();
                Object wanted = step.get("until_error");  // what a retried step waits for: this error, or none
                Map<String, Object> answer;
                int attempts = 0;
                while (true) {  // "retry_ms": tried again until it answers as wanted or that much time has passed
                    attempts++;
                    try {
                        answer = driver.step(step);
                    } catch (Throwable t) {
                        answer = error(t);
                    }
                    boolean done = wanted == null ? !answer.containsKey("error") : wanted.equals(answer.get("error"));
                    if (done || System.currentTimeMillis() >= deadline) {
                        break;
                    }
                    Thread.sleep(200);
                }
                result.putAll(answer);
                result.put("attempts", attempts);
                result.put("ms", (System.nanoTime() - began) / 1_000_000);
                out.println("RESULT " + Json.write(result));
                out.flush();
            }
        } finally {
            driver.close();
        }
        System.exit(0);  // the clients' own threads are daemons, but a stuck one must not keep the JVM
    }

    private static byte[] readAll(InputStream in) throws Exception {
        ByteArrayOutputStream buffer = new ByteArrayOutputStream();
        byte[] chunk = new byte[8192];
        int n;
        while ((n = in.read(chunk)) > 0) {
            buffer.write(chunk, 0, n);
        }
        return buffer.toByteArray();
    }

    private void close() {
        for (Member m : members.values()) {
            m.consumer.close(Duration.ofSeconds(5));
        }
        for (Admin a : admins.values()) {
            a.close(Duration.ofSeconds(5));
        }
    }

    private Map<String, Object> step(Map<String, Object> step) throws Exception {
        String op = (String) step.get("op");
        switch (op) {
            case "version": return one("version", clientVersion());
            case "produce": return produce(step);
            case "consume": return consume(step);
            case "open": return open(step);
            case "poll": return poll(step);
            case "commit": return commit(step);
            case "close": return closeMember(step);
            case "create_topics": return createTopics(step);
            case "list_topics": return one("topics", sorted(admin(step).listTopics().names().get(TIMEOUT_S, TimeUnit.SECONDS)));
            case "describe_topics": return describeTopics(step);
            case "delete_topics": return deleteTopics(step);
            case "create_partitions": return createPartitions(step);
            case "describe_cluster": return describeCluster(step);
            case "describe_configs": return describeConfigs(step);
            case "alter_configs": return alterConfigs(step);
            case "list_groups": return listGroups(step);
            case "describe_groups": return describeGroups(step);
            case "delete_groups": return perName(admin(step).deleteConsumerGroups(strings(step.get("groups"))).deletedGroups());
            case "list_group_offsets": return listGroupOffsets(step);
            case "alter_group_offsets": return alterGroupOffsets(step);
            case "list_offsets": return listOffsets(step);
            case "delete_records": return deleteRecords(step);
            case "create_acls": return createAcls(step);
            case "describe_acls": return describeAcls(step);
            case "delete_acls": return deleteAcls(step);
            case "alter_scram": return alterScram(step);
            case "describe_scram": return describeScram(step);
            case "txn_produce": return txnProduce(step);
            case "ctp": return consumeTransformProduce(step);
            case "fence": return fence(step);
            case "member": return member(step);
            case "produce_until": return produceUntil(step);
            default: throw new IllegalArgumentException("unknown op " + op);
        }
    }

    /** The version kafka-clients says it is (its kafka/kafka-version.properties, in every version). */
    private static String clientVersion() throws Exception {
        Properties props = new Properties();
        try (InputStream in = KafkaProducer.class.getResourceAsStream("/kafka/kafka-version.properties")) {
            props.load(in);
        }
        return props.getProperty("version");
    }

    // ------------------------------------------------------------------------------------------- settings

    private Properties settings(Map<String, Object> step) {
        Properties props = new Properties();
        for (Map.Entry<String, Object> e : base.entrySet()) {
            props.put(e.getKey(), String.valueOf(e.getValue()));
        }
        for (Map.Entry<String, Object> e : map(step.getOrDefault("config", new LinkedHashMap<>())).entrySet()) {
            if (e.getValue() == null) {
                props.remove(e.getKey());
            } else {
                props.put(e.getKey(), String.valueOf(e.getValue()));
            }
        }
        return props;
    }

    private Admin admin(Map<String, Object> step) {
        Properties props = settings(step);
        String key = new TreeMap<>(props).toString();
        return admins.computeIfAbsent(key, k -> Admin.create(props));
    }

    // ------------------------------------------------------------------------------------------- producer

    /** count records, keys k0.., values {prefix}0..; every send's metadata (offset -1 when acks=0). */
    private Map<String, Object> produce(Map<String, Object> step) throws Exception {
        String topic = (String) step.get("topic");
        int count = integer(step.get("count"));
        Integer partition = step.get("partition") == null ? null : integer(step.get("partition"));
        String prefix = (String) step.getOrDefault("value_prefix", "v");
        Map<String, Object> result = new LinkedHashMap<>();
        List<Future<RecordMetadata>> sends = new ArrayList<>();
        try (KafkaProducer<String, String> producer =
                     new KafkaProducer<>(settings(step), new StringSerializer(), new StringSerializer())) {
            for (int i = 0; i < count; i++) {
                sends.add(producer.send(new ProducerRecord<>(topic, partition, "k" + i, prefix + i)));
            }
            producer.flush();
            List<Object> offsets = new ArrayList<>();
            int acked = 0;
            for (Future<RecordMetadata> f : sends) {
                try {
                    RecordMetadata md = f.get(TIMEOUT_S, TimeUnit.SECONDS);
                    offsets.add(pair(md.partition(), md.offset()));
                    acked++;
                } catch (ExecutionException e) {
                    if (!result.containsKey("error")) {
                        result.putAll(error(e));
                    }
                }
            }
            result.put("acked", acked);
            result.put("offsets", offsets);
        }
        return result;
    }

    // ------------------------------------------------------------------------------------------- consumers

    /**
     * Reads until "expect" records arrived (or timeout_ms passed): with "group" through a subscription (and a
     * commitSync of what was read when "commit" is true), else from the beginning of every partition.
     */
    private Map<String, Object> consume(Map<String, Object> step) {
        String topic = (String) step.get("topic");
        boolean toEnd = Boolean.TRUE.equals(step.get("to_end"));
        int expect = toEnd ? 0 : integer(step.get("expect"));
        long timeoutMs = integer(step.getOrDefault("timeout_ms", 30000L));
        Properties props = settings(step);
        String group = (String) step.get("group");
        if (group != null) {
            props.put("group.id", group);
        }
        props.putIfAbsent("auto.offset.reset", "earliest");
        props.putIfAbsent("enable.auto.commit", "false");
        List<Object> records = new ArrayList<>();
        Map<String, Object> result = new LinkedHashMap<>();
        try (KafkaConsumer<String, String> consumer =
                     new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
            if (group != null) {
                consumer.subscribe(Collections.singletonList(topic));
            } else {
                List<TopicPartition> parts = new ArrayList<>();
                consumer.partitionsFor(topic, Duration.ofSeconds(TIMEOUT_S))
                        .forEach(p -> parts.add(new TopicPartition(topic, p.partition())));
                consumer.assign(parts);
                consumer.seekToBeginning(parts);
            }
            long deadline = System.currentTimeMillis() + timeoutMs;
            while (records.size() < expect && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                    records.add(record(r));
                }
            }
            if (toEnd) {  // "to_end" (assigned only): every partition read up to its end offset as the isolation
                // level sees it (read_committed: the last stable offset), control records skipped
                if ("read_committed".equals(props.get("isolation.level"))) {
                    settled(props, consumer.assignment(), deadline);
                }
                Map<TopicPartition, Long> ends = consumer.endOffsets(consumer.assignment(), Duration.ofSeconds(TIMEOUT_S));
                while (!reached(consumer, ends) && System.currentTimeMillis() < deadline) {
                    for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                        records.add(record(r));
                    }
                }
                Map<String, Object> positions = new TreeMap<>();
                for (TopicPartition tp : consumer.assignment()) {
                    positions.put(tp.toString(), consumer.position(tp));
                }
                result.put("ends", positions);
                if (!reached(consumer, ends)) {
                    result.put("error", "Timeout");
                    result.put("message", "not at the end offsets " + ends + ": " + positions);
                }
            }
            if (group != null && Boolean.TRUE.equals(step.get("commit"))) {
                consumer.commitSync(Duration.ofSeconds(TIMEOUT_S));
            }
        }
        result.put("records", records);
        if (records.size() < expect) {
            result.put("error", "Timeout");
            result.put("message", "read " + records.size() + " of " + expect + " records");
        }
        return result;
    }

    /**
     * Waits (until the deadline) for the last stable offsets to reach the high watermarks: every transaction the
     * scenario ended is settled in its partitions. Kafka answers EndTxn before its markers are written, so a
     * read_committed read right after a commit could otherwise end before the committed records.
     */
    private static void settled(Properties props, Set<TopicPartition> parts, long deadline) {
        Properties uncommitted = new Properties();
        uncommitted.putAll(props);
        uncommitted.put("isolation.level", "read_uncommitted");
        uncommitted.remove("group.id");
        Properties committed = new Properties();
        committed.putAll(uncommitted);
        committed.put("isolation.level", "read_committed");
        try (KafkaConsumer<String, String> high = new KafkaConsumer<>(uncommitted, new StringDeserializer(),
                new StringDeserializer());
             KafkaConsumer<String, String> stable = new KafkaConsumer<>(committed, new StringDeserializer(),
                     new StringDeserializer())) {
            while (System.currentTimeMillis() < deadline) {
                Duration wait = Duration.ofSeconds(TIMEOUT_S);
                if (stable.endOffsets(parts, wait).equals(high.endOffsets(parts, wait))) {
                    return;
                }
                try {
                    Thread.sleep(100);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    return;
                }
            }
        }
    }

    private static boolean reached(KafkaConsumer<String, String> consumer, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> e : ends.entrySet()) {
            if (consumer.position(e.getKey(), Duration.ofSeconds(TIMEOUT_S)) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    private static final class Member {
        final KafkaConsumer<String, String> consumer;
        final List<Object> events = new ArrayList<>();  // the rebalance callbacks since the last report
        final List<Object> values = new ArrayList<>();  // the records since the last report

        Member(KafkaConsumer<String, String> consumer) {
            this.consumer = consumer;
        }
    }

    /** A group member: {"member", "topics", "config": {"group.id", "partition.assignment.strategy", ...}}. */
    private Map<String, Object> open(Map<String, Object> step) {
        String name = (String) step.get("member");
        Properties props = settings(step);
        props.putIfAbsent("auto.offset.reset", "earliest");
        props.putIfAbsent("enable.auto.commit", "false");
        KafkaConsumer<String, String> consumer =
                new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer());
        Member member = new Member(consumer);
        consumer.subscribe(strings(step.get("topics")), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                member.events.add(event("revoked", partitions));
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                member.events.add(event("assigned", partitions));
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> partitions) {
                member.events.add(event("lost", partitions));
            }
        });
        members.put(name, member);
        return new LinkedHashMap<>();
    }

    /**
     * Polls the named members in turn (100 ms each) until, for "rounds" rounds in a row (default 3), their
     * assignments add up to "assigned" partitions with none of them empty and they read "records" records in
     * all (each condition only when given). Answers each member's assignment, generation, member id, the
     * records it read and its rebalance events since the last report.
     */
    private Map<String, Object> poll(Map<String, Object> step) {
        List<String> names = strings(step.get("members"));
        Integer assigned = step.get("assigned") == null ? null : integer(step.get("assigned"));
        Integer expect = step.get("records") == null ? null : integer(step.get("records"));
        int rounds = integer(step.getOrDefault("rounds", 3L));
        long deadline = System.currentTimeMillis() + integer(step.getOrDefault("timeout_ms", 60000L));
        int good = 0;
        boolean reached = false;
        while (System.currentTimeMillis() < deadline) {
            int total = 0;
            int read = 0;
            boolean someEmpty = false;
            for (String name : names) {
                Member m = members.get(name);
                ConsumerRecords<String, String> got = m.consumer.poll(Duration.ofMillis(100));
                for (ConsumerRecord<String, String> r : got) {
                    m.values.add(record(r));
                }
                total += m.consumer.assignment().size();
                someEmpty |= m.consumer.assignment().isEmpty();
                read += m.values.size();
            }
            boolean ok = (assigned == null || (total == assigned && !someEmpty)) && (expect == null || read >= expect);
            good = ok ? good + 1 : 0;
            if (good >= rounds) {
                reached = true;
                break;
            }
        }
        Map<String, Object> result = new LinkedHashMap<>();
        Map<String, Object> each = new LinkedHashMap<>();
        for (String name : names) {
            Member m = members.get(name);
            Map<String, Object> state = new LinkedHashMap<>();
            state.put("assignment", partitions(m.consumer.assignment()));
            state.put("generation", m.consumer.groupMetadata().generationId());
            state.put("member_id", m.consumer.groupMetadata().memberId());
            state.put("records", new ArrayList<>(m.values));
            state.put("events", new ArrayList<>(m.events));
            m.values.clear();
            m.events.clear();
            each.put(name, state);
        }
        result.put("members", each);
        if (!reached) {
            result.put("error", "Timeout");
            result.put("message", "the members did not reach the condition in time");
        }
        return result;
    }

    private Map<String, Object> commit(Map<String, Object> step) {
        Member m = members.get((String) step.get("member"));
        m.consumer.commitSync(Duration.ofSeconds(TIMEOUT_S));
        Map<String, Object> committed = new TreeMap<>();
        for (TopicPartition tp : m.consumer.assignment()) {
            committed.put(tp.toString(), m.consumer.position(tp));
        }
        return one("positions", committed);
    }

    private Map<String, Object> closeMember(Map<String, Object> step) {
        Member m = members.remove((String) step.get("member"));
        m.consumer.close(Duration.ofSeconds(TIMEOUT_S));
        return one("events", m.events);
    }

    private static Map<String, Object> event(String what, Collection<TopicPartition> partitions) {
        Map<String, Object> e = new LinkedHashMap<>();
        e.put("event", what);
        e.put("partitions", partitions(partitions));
        return e;
    }

    private static List<Object> record(ConsumerRecord<String, String> r) {
        List<Object> out = new ArrayList<>();
        out.add(r.partition());
        out.add(r.offset());
        out.add(r.key());
        out.add(r.value());
        return out;
    }

    // ------------------------------------------------------------------------------------------- live members

    /**
     * A group member in a JVM of its own, running while the test goes on ({"op": "member", "topics": [...], or
     * "pattern": a java.util.regex.Pattern the client matches against the topics it sees, or
     * "subscription_pattern": a regular expression the broker resolves (KIP-848, clients from 4.0), "config":
     * {"group.id", "group.protocol", ...}, "stop_file"}): it polls until stop_file exists, then closes, leaving the
     * group. After every poll that returned records it prints them, then commits them (commitSync), so it never
     * committed what it did not print, even when killed. It prints as things happen (flushed, so a kill -9 loses
     * none) lines EVENT {"event", "t": wall-clock ms, ...}: "assigned", "revoked" and "lost" from its rebalance
     * listener (which does nothing else), with "partitions"; "assignment" with "partitions",
     * "member_id" and "epoch" whenever a poll leaves a different assignment; "records" with {partition: [offsets]};
     * "commit_failed" with the error. A poll that throws ends the member: the step answers that error.
     */
    private Map<String, Object> member(Map<String, Object> step) throws Exception {
        Properties props = settings(step);
        props.putIfAbsent("auto.offset.reset", "earliest");
        props.putIfAbsent("enable.auto.commit", "false");
        Path stop = Paths.get((String) step.get("stop_file"));
        long polls = 0;
        long read = 0;
        try (KafkaConsumer<String, String> consumer =
                     new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer())) {
            ConsumerRebalanceListener listener = new Recorder();
            if (step.get("pattern") != null) {
                consumer.subscribe(Pattern.compile((String) step.get("pattern")), listener);
            } else if (step.get("subscription_pattern") != null) {  // 4.0+: by reflection, as the driver builds on 2.8
                Class<?> type = Class.forName("org.apache.kafka.clients.consumer.SubscriptionPattern");
                Object pattern = type.getConstructor(String.class).newInstance(step.get("subscription_pattern"));
                try {
                    consumer.getClass().getMethod("subscribe", type, ConsumerRebalanceListener.class)
                            .invoke(consumer, pattern, listener);
                } catch (InvocationTargetException e) {
                    throw (Exception) e.getCause();
                }
            } else {
                consumer.subscribe(strings(step.get("topics")), listener);
            }
            Set<TopicPartition> last = Collections.emptySet();
            while (!Files.exists(stop)) {
                ConsumerRecords<String, String> got = consumer.poll(Duration.ofMillis(100));
                polls++;
                Set<TopicPartition> assignment = consumer.assignment();
                if (!assignment.equals(last)) {
                    last = assignment;
                    Map<String, Object> changed = now(event("assignment", assignment));
                    changed.put("member_id", consumer.groupMetadata().memberId());
                    changed.put("epoch", consumer.groupMetadata().generationId());
                    emit(changed);
                }
                if (got.isEmpty()) {
                    continue;
                }
                Map<String, Object> offsets = new TreeMap<>();
                for (ConsumerRecord<String, String> r : got) {
                    String tp = new TopicPartition(r.topic(), r.partition()).toString();
                    @SuppressWarnings("unchecked")
                    List<Object> each = (List<Object>) offsets.computeIfAbsent(tp, k -> new ArrayList<>());
                    each.add(r.offset());
                    read++;
                }
                Map<String, Object> batch = now(one("event", "records"));
                batch.put("records", offsets);
                emit(batch);
                try {
                    consumer.commitSync(Duration.ofSeconds(TIMEOUT_S));
                } catch (Exception e) {
                    Map<String, Object> failed = now(one("event", "commit_failed"));
                    failed.putAll(error(e));
                    emit(failed);
                }
            }
        }  // close(): the listener's revocation, then the leave
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("polls", polls);
        result.put("records", read);
        return result;
    }

    /** Prints each rebalance callback as it happens (see {@link #member}). */
    private static final class Recorder implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            emit(now(event("revoked", partitions)));
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            emit(now(event("assigned", partitions)));
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            emit(now(event("lost", partitions)));
        }
    }

    /**
     * Writes to "topic" until stop_file exists, about "rate" records a second: record i to partition
     * i % "partitions", key k{i}, value v{i}. Answers the acknowledged offsets, {partition: [offsets]}, and the
     * first send error.
     */
    private Map<String, Object> produceUntil(Map<String, Object> step) throws Exception {
        String topic = (String) step.get("topic");
        int partitions = integer(step.get("partitions"));
        long pause = Math.max(1, 1000 / integer(step.getOrDefault("rate", 100L)));
        Path stop = Paths.get((String) step.get("stop_file"));
        Map<String, Object> acked = new TreeMap<>();
        Map<String, Object> result = new LinkedHashMap<>();
        try (KafkaProducer<String, String> producer =
                     new KafkaProducer<>(settings(step), new StringSerializer(), new StringSerializer())) {
            for (int i = 0; !Files.exists(stop); i++) {
                producer.send(new ProducerRecord<>(topic, i % partitions, "k" + i, "v" + i), (md, e) -> {
                    synchronized (acked) {
                        if (e != null) {
                            result.putIfAbsent("error", e.getClass().getSimpleName());
                            result.putIfAbsent("message", String.valueOf(e.getMessage()));
                        } else {
                            @SuppressWarnings("unchecked")
                            List<Object> each = (List<Object>) acked.computeIfAbsent(
                                    String.valueOf(md.partition()), k -> new ArrayList<>());
                            each.add(md.offset());
                        }
                    }
                });
                Thread.sleep(pause);
            }
            producer.flush();
        }
        synchronized (acked) {
            result.put("acked", acked);
        }
        return result;
    }

    private static synchronized void emit(Map<String, Object> event) {
        System.out.println("EVENT " + Json.write(event));
        System.out.flush();
    }

    /** The event with "t": now, in wall-clock ms (comparable between the JVMs of one machine). */
    private static Map<String, Object> now(Map<String, Object> event) {
        event.put("t", System.currentTimeMillis());
        return event;
    }

    // ------------------------------------------------------------------------------------------- admin: topics

    private Map<String, Object> createTopics(Map<String, Object> step) throws Exception {
        List<NewTopic> topics = new ArrayList<>();
        for (Object raw : list(step.get("topics"))) {
            Map<String, Object> t = map(raw);
            Optional<Integer> partitions = t.get("partitions") == null ? Optional.empty()
                    : Optional.of(integer(t.get("partitions")));
            Optional<Short> replicas = t.get("replication") == null ? Optional.empty()
                    : Optional.of((short) integer(t.get("replication")));
            NewTopic topic = new NewTopic((String) t.get("name"), partitions, replicas);
            Map<String, String> configs = new HashMap<>();
            for (Map.Entry<String, Object> c : map(t.getOrDefault("configs", new LinkedHashMap<>())).entrySet()) {
                configs.put(c.getKey(), String.valueOf(c.getValue()));
            }
            topics.add(topic.configs(configs));
        }
        return perName(admin(step).createTopics(topics).values());
    }

    /** DescribeTopicsResult.all() up to 3.x, allTopicNames() from 3.1 (all() is gone in 4.0). */
    @SuppressWarnings("unchecked")
    private Map<String, Object> describeTopics(Map<String, Object> step) throws Exception {
        Object described = admin(step).describeTopics(strings(step.get("topics")));
        KafkaFuture<Map<String, TopicDescription>> all =
                (KafkaFuture<Map<String, TopicDescription>>) call(described, "allTopicNames", "all");
        Map<String, Object> out = new TreeMap<>();
        for (TopicDescription d : all.get(TIMEOUT_S, TimeUnit.SECONDS).values()) {
            Map<String, Object> t = new LinkedHashMap<>();
            List<Object> parts = new ArrayList<>();
            for (TopicPartitionInfo p : d.partitions()) {
                Map<String, Object> part = new LinkedHashMap<>();
                part.put("partition", p.partition());
                part.put("leader", p.leader() == null ? null : p.leader().id());
                part.put("replicas", p.replicas().size());
                part.put("isr", p.isr().size());
                parts.add(part);
            }
            t.put("internal", d.isInternal());
            t.put("partitions", parts);
            out.put(d.name(), t);
        }
        return one("topics", out);
    }

    /** DeleteTopicsResult.values() up to 3.x, topicNameValues() from 3.1 (values() is gone in 4.0). */
    @SuppressWarnings("unchecked")
    private Map<String, Object> deleteTopics(Map<String, Object> step) throws Exception {
        Object deleted = admin(step).deleteTopics(strings(step.get("topics")));
        return perName((Map<String, KafkaFuture<Void>>) call(deleted, "topicNameValues", "values"));
    }

    private Map<String, Object> createPartitions(Map<String, Object> step) throws Exception {
        Map<String, NewPartitions> increase = new HashMap<>();
        for (Map.Entry<String, Object> e : map(step.get("topics")).entrySet()) {
            increase.put(e.getKey(), NewPartitions.increaseTo(integer(e.getValue())));
        }
        return perName(admin(step).createPartitions(increase).values());
    }

    private Map<String, Object> describeCluster(Map<String, Object> step) throws Exception {
        DescribeClusterResult cluster = admin(step).describeCluster();
        Map<String, Object> out = new LinkedHashMap<>();
        List<Object> nodes = new ArrayList<>();
        for (Node n : cluster.nodes().get(TIMEOUT_S, TimeUnit.SECONDS)) {
            nodes.add(n.id() + "@" + n.host() + ":" + n.port());
        }
        out.put("nodes", nodes);
        Node controller = cluster.controller().get(TIMEOUT_S, TimeUnit.SECONDS);
        out.put("controller", controller == null ? null : controller.id());
        out.put("cluster_id", cluster.clusterId().get(TIMEOUT_S, TimeUnit.SECONDS));
        return out;
    }

    // ------------------------------------------------------------------------------------------ admin: configs

    private static ConfigResource resource(Map<String, Object> step) {
        ConfigResource.Type type = ConfigResource.Type.valueOf(((String) step.get("resource")).toUpperCase());
        return new ConfigResource(type, (String) step.get("resource_name"));
    }

    /** {"configs": {name: [value, source, read_only]}} for the asked "keys" (all without). */
    private Map<String, Object> describeConfigs(Map<String, Object> step) throws Exception {
        ConfigResource res = resource(step);
        Config config = admin(step).describeConfigs(Collections.singleton(res)).all()
                .get(TIMEOUT_S, TimeUnit.SECONDS).get(res);
        List<String> keys = step.get("keys") == null ? null : strings(step.get("keys"));
        Map<String, Object> out = new TreeMap<>();
        for (ConfigEntry e : config.entries()) {
            if (keys == null || keys.contains(e.name())) {
                List<Object> v = new ArrayList<>();
                v.add(e.value());
                v.add(String.valueOf(e.source()));
                v.add(e.isReadOnly());
                out.put(e.name(), v);
            }
        }
        return one("configs", out);
    }

    /** incrementalAlterConfigs: {"set": {name: value}, "delete": [name]}. */
    private Map<String, Object> alterConfigs(Map<String, Object> step) throws Exception {
        ConfigResource res = resource(step);
        List<AlterConfigOp> ops = new ArrayList<>();
        for (Map.Entry<String, Object> e : map(step.getOrDefault("set", new LinkedHashMap<>())).entrySet()) {
            ops.add(new AlterConfigOp(new ConfigEntry(e.getKey(), String.valueOf(e.getValue())),
                    AlterConfigOp.OpType.SET));
        }
        for (String name : strings(step.getOrDefault("delete", new ArrayList<>()))) {
            ops.add(new AlterConfigOp(new ConfigEntry(name, ""), AlterConfigOp.OpType.DELETE));
        }
        Map<ConfigResource, Collection<AlterConfigOp>> request = new HashMap<>();
        request.put(res, ops);
        admin(step).incrementalAlterConfigs(request).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        return new LinkedHashMap<>();
    }

    // ------------------------------------------------------------------------------------------- admin: groups

    @SuppressWarnings("deprecation")
    private Map<String, Object> listGroups(Map<String, Object> step) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (ConsumerGroupListing g : admin(step).listConsumerGroups().all().get(TIMEOUT_S, TimeUnit.SECONDS)) {
            out.put(g.groupId(), g.state().map(String::valueOf).orElse(null));
        }
        return one("groups", out);
    }

    @SuppressWarnings("deprecation")
    private Map<String, Object> describeGroups(Map<String, Object> step) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<String, KafkaFuture<ConsumerGroupDescription>> e :
                admin(step).describeConsumerGroups(strings(step.get("groups"))).describedGroups().entrySet()) {
            try {
                ConsumerGroupDescription d = e.getValue().get(TIMEOUT_S, TimeUnit.SECONDS);
                Map<String, Object> g = new LinkedHashMap<>();
                g.put("state", String.valueOf(d.state()));
                g.put("assignor", d.partitionAssignor());
                g.put("simple", d.isSimpleConsumerGroup());
                g.put("coordinator", d.coordinator() == null ? null : d.coordinator().id());
                List<Object> ms = new ArrayList<>();
                for (MemberDescription m : d.members()) {
                    Map<String, Object> member = new LinkedHashMap<>();
                    member.put("member_id", m.consumerId());
                    member.put("instance_id", m.groupInstanceId().orElse(null));
                    member.put("client_id", m.clientId());
                    member.put("host", m.host());
                    member.put("assignment", partitions(m.assignment().topicPartitions()));
                    ms.add(member);
                }
                g.put("members", ms);
                out.put(e.getKey(), g);
            } catch (ExecutionException ex) {
                out.put(e.getKey(), error(ex));
            }
        }
        return one("groups", out);
    }

    private Map<String, Object> listGroupOffsets(Map<String, Object> step) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets = admin(step).listConsumerGroupOffsets((String) step.get("group"))
                .partitionsToOffsetAndMetadata().get(TIMEOUT_S, TimeUnit.SECONDS);
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
            out.put(e.getKey().toString(), e.getValue() == null ? null : e.getValue().offset());
        }
        return one("offsets", out);
    }

    /** {"group", "offsets": {"topic-partition": offset}}. */
    private Map<String, Object> alterGroupOffsets(Map<String, Object> step) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (Map.Entry<String, Object> e : map(step.get("offsets")).entrySet()) {
            offsets.put(topicPartition(e.getKey()), new OffsetAndMetadata(integer(e.getValue())));
        }
        admin(step).alterConsumerGroupOffsets((String) step.get("group"), offsets).all()
                .get(TIMEOUT_S, TimeUnit.SECONDS);
        return new LinkedHashMap<>();
    }

    // ------------------------------------------------------------------------------------------ admin: records

    /** {"partitions": ["t-0", ...], "spec": "earliest" | "latest"}. */
    private Map<String, Object> listOffsets(Map<String, Object> step) throws Exception {
        OffsetSpec spec = "earliest".equals(step.get("spec")) ? OffsetSpec.earliest() : OffsetSpec.latest();
        Map<TopicPartition, OffsetSpec> request = new HashMap<>();
        for (String tp : strings(step.get("partitions"))) {
            request.put(topicPartition(tp), spec);
        }
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> got =
                admin(step).listOffsets(request).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> e : got.entrySet()) {
            out.put(e.getKey().toString(), e.getValue().offset());
        }
        return one("offsets", out);
    }

    /** {"partitions": {"t-0": before}}: the new low watermark of each. */
    private Map<String, Object> deleteRecords(Map<String, Object> step) throws Exception {
        Map<TopicPartition, RecordsToDelete> request = new HashMap<>();
        for (Map.Entry<String, Object> e : map(step.get("partitions")).entrySet()) {
            request.put(topicPartition(e.getKey()), RecordsToDelete.beforeOffset(integer(e.getValue())));
        }
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<TopicPartition, KafkaFuture<DeletedRecords>> e :
                admin(step).deleteRecords(request).lowWatermarks().entrySet()) {
            try {
                out.put(e.getKey().toString(), e.getValue().get(TIMEOUT_S, TimeUnit.SECONDS).lowWatermark());
            } catch (ExecutionException ex) {
                out.put(e.getKey().toString(), error(ex));
            }
        }
        return one("low_watermarks", out);
    }

    // ------------------------------------------------------------------------------------------- admin: ACLs

    private static AclBinding binding(Map<String, Object> a) {
        ResourcePattern pattern = new ResourcePattern(
                ResourceType.valueOf(((String) a.get("resource_type")).toUpperCase()), (String) a.get("name"),
                PatternType.valueOf(((String) a.getOrDefault("pattern", "LITERAL")).toUpperCase()));
        AccessControlEntry entry = new AccessControlEntry((String) a.get("principal"),
                (String) a.getOrDefault("host", "*"),
                AclOperation.valueOf(((String) a.get("operation")).toUpperCase()),
                AclPermissionType.valueOf(((String) a.getOrDefault("permission", "ALLOW")).toUpperCase()));
        return new AclBinding(pattern, entry);
    }

    /** A filter: the fields given must match, the others are ANY. */
    private static AclBindingFilter filter(Map<String, Object> f) {
        ResourcePatternFilter pattern = new ResourcePatternFilter(
                ResourceType.valueOf(((String) f.getOrDefault("resource_type", "ANY")).toUpperCase()),
                (String) f.get("name"),
                PatternType.valueOf(((String) f.getOrDefault("pattern", "ANY")).toUpperCase()));
        AccessControlEntryFilter entry = new AccessControlEntryFilter((String) f.get("principal"),
                (String) f.get("host"),
                AclOperation.valueOf(((String) f.getOrDefault("operation", "ANY")).toUpperCase()),
                AclPermissionType.valueOf(((String) f.getOrDefault("permission", "ANY")).toUpperCase()));
        return new AclBindingFilter(pattern, entry);
    }

    private static Map<String, Object> describe(AclBinding b) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("resource_type", b.pattern().resourceType().name());
        out.put("name", b.pattern().name());
        out.put("pattern", b.pattern().patternType().name());
        out.put("principal", b.entry().principal());
        out.put("host", b.entry().host());
        out.put("operation", b.entry().operation().name());
        out.put("permission", b.entry().permissionType().name());
        return out;
    }

    private Map<String, Object> createAcls(Map<String, Object> step) throws Exception {
        List<AclBinding> bindings = new ArrayList<>();
        for (Object a : list(step.get("acls"))) {
            bindings.add(binding(map(a)));
        }
        admin(step).createAcls(bindings).all().get(TIMEOUT_S, TimeUnit.SECONDS);
        return one("created", bindings.size());
    }

    private Map<String, Object> describeAcls(Map<String, Object> step) throws Exception {
        List<Object> out = new ArrayList<>();
        for (AclBinding b : admin(step).describeAcls(filter(map(step.get("filter")))).values()
                .get(TIMEOUT_S, TimeUnit.SECONDS)) {
            out.add(describe(b));
        }
        return one("acls", out);
    }

    private Map<String, Object> deleteAcls(Map<String, Object> step) throws Exception {
        List<AclBindingFilter> filters = new ArrayList<>();
        for (Object f : list(step.get("filters"))) {
            filters.add(filter(map(f)));
        }
        List<Object> out = new ArrayList<>();
        for (AclBinding b : admin(step).deleteAcls(filters).all().get(TIMEOUT_S, TimeUnit.SECONDS)) {
            out.add(describe(b));
        }
        return one("deleted", out);
    }

    // ------------------------------------------------------------------------------------------- admin: SCRAM

    /** {"upsert": [{"user", "mechanism", "iterations", "password"}], "delete": [{"user", "mechanism"}]}. */
    private Map<String, Object> alterScram(Map<String, Object> step) throws Exception {
        List<UserScramCredentialAlteration> changes = new ArrayList<>();
        for (Object raw : list(step.getOrDefault("upsert", new ArrayList<>()))) {
            Map<String, Object> u = map(raw);
            ScramCredentialInfo info = new ScramCredentialInfo(mechanism(u), integer(u.getOrDefault("iterations", 8192L)));
            changes.add(new UserScramCredentialUpsertion((String) u.get("user"), info, (String) u.get("password")));
        }
        for (Object raw : list(step.getOrDefault("delete", new ArrayList<>()))) {
            Map<String, Object> u = map(raw);
            changes.add(new UserScramCredentialDeletion((String) u.get("user"), mechanism(u)));
        }
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<String, KafkaFuture<Void>> e : admin(step).alterUserScramCredentials(changes).values().entrySet()) {
            try {
                e.getValue().get(TIMEOUT_S, TimeUnit.SECONDS);
                out.put(e.getKey(), "ok");
            } catch (ExecutionException ex) {
                out.put(e.getKey(), error(ex));
            }
        }
        return one("users", out);
    }

    private static ScramMechanism mechanism(Map<String, Object> u) {
        return ScramMechanism.fromMechanismName((String) u.getOrDefault("mechanism", "SCRAM-SHA-512"));
    }

    /** {"users": {user: [[mechanism, iterations], ...] or an error}}. */
    private Map<String, Object> describeScram(Map<String, Object> step) throws Exception {
        List<String> users = strings(step.get("users"));
        DescribeUserScramCredentialsResult result = admin(step).describeUserScramCredentials(users);
        Map<String, Object> out = new TreeMap<>();
        for (String user : users) {
            try {
                UserScramCredentialsDescription d = result.description(user).get(TIMEOUT_S, TimeUnit.SECONDS);
                List<Object> infos = new ArrayList<>();
                for (ScramCredentialInfo i : d.credentialInfos()) {
                    infos.add(pair(i.mechanism().mechanismName(), i.iterations()));
                }
                out.put(user, infos);
            } catch (ExecutionException ex) {
                out.put(user, error(ex));
            }
        }
        return one("users", out);
    }

    // ------------------------------------------------------------------------------------------- transactions

    private KafkaProducer<String, String> transactional(Map<String, Object> step, String transactionalId) {
        Properties props = settings(step);
        props.put("transactional.id", transactionalId);
        props.putIfAbsent("transaction.timeout.ms", "60000");
        return new KafkaProducer<>(props, new StringSerializer(), new StringSerializer());
    }

    /**
     * One transactional producer ({"transactional_id"}) runs the "transactions" in turn, each
     * {"count", "commit": true|false, "value_prefix"}: record i of a transaction goes to partition i % "partitions"
     * with key k{i} and value {prefix}{i}; then commitTransaction or abortTransaction. Answers each transaction's
     * offsets and the outcome.
     */
    private Map<String, Object> txnProduce(Map<String, Object> step) throws Exception {
        String topic = (String) step.get("topic");
        int partitions = integer(step.get("partitions"));
        List<Object> outcomes = new ArrayList<>();
        try (KafkaProducer<String, String> producer = transactional(step, (String) step.get("transactional_id"))) {
            producer.initTransactions();
            for (Object raw : list(step.get("transactions"))) {
                Map<String, Object> txn = map(raw);
                String prefix = (String) txn.get("value_prefix");
                producer.beginTransaction();
                List<Future<RecordMetadata>> sends = new ArrayList<>();
                for (int i = 0; i < integer(txn.get("count")); i++) {
                    sends.add(producer.send(new ProducerRecord<>(topic, i % partitions, "k" + i, prefix + i)));
                }
                producer.flush();
                List<Object> offsets = new ArrayList<>();
                for (Future<RecordMetadata> f : sends) {
                    RecordMetadata md = f.get(TIMEOUT_S, TimeUnit.SECONDS);
                    offsets.add(pair(md.partition(), md.offset()));
                }
                boolean commit = Boolean.TRUE.equals(txn.get("commit"));
                if (commit) {
                    producer.commitTransaction();
                } else {
                    producer.abortTransaction();
                }
                Map<String, Object> outcome = new LinkedHashMap<>();
                outcome.put("outcome", commit ? "committed" : "aborted");
                outcome.put("offsets", offsets);
                outcomes.add(outcome);
            }
        }
        return one("transactions", outcomes);
    }

    /**
     * The consume-transform-produce loop: a read_committed consumer in "group" subscribed to "input", and a
     * transactional producer ("transactional_id") that writes each polled batch (at most "per_txn" records) to
     * "output", same partition and key, value "out-" + value, and sends the consumer's offsets to the same
     * transaction (by ConsumerGroupMetadata, or by group id with "offsets_by": "group_id", the overload Kafka 4.0
     * removed). Transaction number "abort_txn" is aborted once and the consumer rewound to redo it. Stops when
     * "expect" input records were committed.
     */
    private Map<String, Object> consumeTransformProduce(Map<String, Object> step) throws Exception {
        String input = (String) step.get("input");
        String output = (String) step.get("output");
        String group = (String) step.get("group");
        int expect = integer(step.get("expect"));
        int abortTxn = integer(step.getOrDefault("abort_txn", -1L));
        boolean byGroupId = "group_id".equals(step.get("offsets_by"));
        long deadline = System.currentTimeMillis() + integer(step.getOrDefault("timeout_ms", 60000L));
        Properties cprops = settings(step);
        cprops.put("group.id", group);
        cprops.put("isolation.level", "read_committed");
        cprops.put("enable.auto.commit", "false");
        cprops.put("auto.offset.reset", "earliest");
        cprops.put("max.poll.records", String.valueOf(integer(step.getOrDefault("per_txn", 10L))));
        int processed = 0;
        int transactions = 0;
        int aborted = 0;
        List<Object> sizes = new ArrayList<>();
        try (KafkaConsumer<String, String> consumer =
                     new KafkaConsumer<>(cprops, new StringDeserializer(), new StringDeserializer());
             KafkaProducer<String, String> producer = transactional(step, (String) step.get("transactional_id"))) {
            producer.initTransactions();
            consumer.subscribe(Collections.singletonList(input));
            while (processed < expect && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                Map<TopicPartition, Long> first = new HashMap<>();
                producer.beginTransaction();
                for (ConsumerRecord<String, String> r : records) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    first.putIfAbsent(tp, r.offset());
                    next.put(tp, new OffsetAndMetadata(r.offset() + 1));
                    producer.send(new ProducerRecord<>(output, r.partition(), r.key(), "out-" + r.value()));
                }
                if (byGroupId) {
                    Method send = producer.getClass().getMethod("sendOffsetsToTransaction", Map.class, String.class);
                    try {
                        send.invoke(producer, next, group);
                    } catch (InvocationTargetException e) {
                        throw (Exception) e.getCause();
                    }
                } else {
                    ConsumerGroupMetadata metadata = consumer.groupMetadata();
                    producer.sendOffsetsToTransaction(next, metadata);
                }
                if (transactions == abortTxn && aborted == 0) {
                    producer.flush();  // the records reach the broker (else the abort drops them client-side)
                    producer.abortTransaction();
                    aborted++;
                    for (Map.Entry<TopicPartition, Long> e : first.entrySet()) {
                        consumer.seek(e.getKey(), e.getValue());  // redo what the aborted transaction held
                    }
                } else {
                    producer.commitTransaction();
                    processed += records.count();
                    sizes.add(records.count());
                }
                transactions++;
            }
        }
        Map<String, Object> result = new LinkedHashMap<>();
        result.put("processed", processed);
        result.put("transactions", transactions);
        result.put("aborted", aborted);
        result.put("committed_sizes", sizes);
        if (processed < expect) {
            result.put("error", "Timeout");
            result.put("message", "processed " + processed + " of " + expect);
        }
        return result;
    }

    /**
     * Zombie fencing: producer A (transactional_id) opens a transaction and writes "a0" to "partition"; producer
     * B initializes with the same transactional_id (which aborts A's transaction and bumps the epoch); A then
     * sends "a1" to the same partition and tries to commit, and each error is answered; B commits b0..b2.
     */
    private Map<String, Object> fence(Map<String, Object> step) throws Exception {
        String topic = (String) step.get("topic");
        int partition = integer(step.getOrDefault("partition", 0L));
        String id = (String) step.get("transactional_id");
        Map<String, Object> result = new LinkedHashMap<>();
        KafkaProducer<String, String> a = transactional(step, id);
        try {
            a.initTransactions();
            a.beginTransaction();
            result.put("a0", a.send(new ProducerRecord<>(topic, partition, "a", "a0")).get(TIMEOUT_S, TimeUnit.SECONDS)
                    .offset());
            try (KafkaProducer<String, String> b = transactional(step, id)) {
                b.initTransactions();
                result.put("a_send", attempt(() -> a.send(new ProducerRecord<>(topic, partition, "a", "a1"))
                        .get(TIMEOUT_S, TimeUnit.SECONDS)));
                result.put("a_commit", attempt(() -> {
                    a.commitTransaction();
                    return null;
                }));
                b.beginTransaction();
                List<Object> offsets = new ArrayList<>();
                for (int i = 0; i < 3; i++) {
                    offsets.add(b.send(new ProducerRecord<>(topic, partition, "b", "b" + i))
                            .get(TIMEOUT_S, TimeUnit.SECONDS).offset());
                }
                b.commitTransaction();
                result.put("b", offsets);
            }
        } finally {
            a.close(Duration.ZERO);
        }
        return result;
    }

    private interface Attempt {
        Object run() throws Exception;
    }

    /** "ok", or the error's simple class name. */
    private static Object attempt(Attempt attempt) {
        try {
            attempt.run();
            return "ok";
        } catch (Throwable t) {
            return error(t).get("error");
        }
    }

    // ------------------------------------------------------------------------------------------- helpers

    /** The first of the named no-argument methods that the object has: APIs renamed between versions. */
    private static Object call(Object target, String... names) throws Exception {
        for (String name : names) {
            Method method;
            try {
                method = target.getClass().getMethod(name);
            } catch (NoSuchMethodException e) {
                continue;
            }
            try {
                return method.invoke(target);
            } catch (InvocationTargetException e) {
                throw (Exception) e.getCause();
            }
        }
        throw new NoSuchMethodException(target.getClass().getName() + " has none of " + String.join(", ", names));
    }

    private static <T> Map<String, Object> perName(Map<String, KafkaFuture<T>> futures) throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (Map.Entry<String, KafkaFuture<T>> e : futures.entrySet()) {
            try {
                e.getValue().get(TIMEOUT_S, TimeUnit.SECONDS);
                out.put(e.getKey(), "ok");
            } catch (ExecutionException ex) {
                out.put(e.getKey(), error(ex));
            }
        }
        return one("results", out);
    }

    private static Map<String, Object> error(Throwable t) {
        Throwable cause = t instanceof ExecutionException && t.getCause() != null ? t.getCause() : t;
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("error", cause.getClass().getSimpleName());
        StringBuilder message = new StringBuilder(String.valueOf(cause.getMessage()));
        for (Throwable c = cause.getCause(); c != null && c != c.getCause(); c = c.getCause()) {
            message.append(" <- ").append(c.getClass().getSimpleName()).append(": ").append(c.getMessage());
        }
        out.put("message", message.toString());
        return out;
    }

    private static Map<String, Object> one(String key, Object value) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put(key, value);
        return out;
    }

    private static List<Object> pair(Object a, Object b) {
        List<Object> out = new ArrayList<>();
        out.add(a);
        out.add(b);
        return out;
    }

    private static List<String> partitions(Collection<TopicPartition> parts) {
        List<String> out = new ArrayList<>();
        for (TopicPartition tp : parts) {
            out.add(tp.toString());
        }
        Collections.sort(out);
        return out;
    }

    private static List<String> sorted(Collection<String> names) {
        List<String> out = new ArrayList<>(names);
        Collections.sort(out);
        return out;
    }

    private static TopicPartition topicPartition(String s) {
        int dash = s.lastIndexOf('-');
        return new TopicPartition(s.substring(0, dash), Integer.parseInt(s.substring(dash + 1)));
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> map(Object o) {
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    private static List<Object> list(Object o) {
        return (List<Object>) o;
    }

    private static List<String> strings(Object o) {
        List<String> out = new ArrayList<>();
        for (Object item : list(o)) {
            out.add((String) item);
        }
        return out;
    }

    private static int integer(Object o) {
        return ((Number) o).intValue();
    }
}
