package bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelEoSStreamProcessor;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

import java.io.BufferedWriter;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One pc-bench row run by Confluent's Java Parallel Consumer.
 *
 * <pre>
 * BenchRunner --bootstrap HOST:PORT --topic T --group G --ends P0:END0,P1:END1,...
 *             --ordering KEY|PARTITION|UNORDERED --concurrency C --batch-size B
 *             --commit-interval-ms MS --work noop|sleep_random|sleep --ms X
 *             --out LOG --timeout SECONDS [--stop-file PATH]
 * </pre>
 *
 * Prints JSON lines on stdout with epoch times in seconds (the clock the Python side uses):
 * {"event":"started"}, {"event":"first_call"} and {"event":"committed"} once the group's committed
 * offsets reached the end of every partition (read back through the Admin client), or
 * {"event":"failed","reason":...}. LOG gets one line per record handled: partition, key, offset,
 * service seconds, and the epoch time the call returned, in the order the handler calls finished.
 * With --stop-file, the run also ends (as failed, its log written) once that file exists.
 */
public final class BenchRunner {

    public static void main(String[] args) throws Exception {
        Map<String, String> options = parse(args);
        String bootstrap = options.get("bootstrap");
        String topic = options.get("topic");
        String group = options.get("group");
        Map<TopicPartition, Long> ends = new HashMap<>();
        long expected = 0;
        for (String pair : options.get("ends").split(",")) {
            String[] parts = pair.split(":");
            long end = Long.parseLong(parts[1]);
            ends.put(new TopicPartition(topic, Integer.parseInt(parts[0])), end);
            expected += end;
        }
        String work = options.get("work");
        double ms = Double.parseDouble(options.getOrDefault("ms", "0"));
        long deadline = System.nanoTime()
                + Duration.ofSeconds(Long.parseLong(options.getOrDefault("timeout", "600"))).toNanos();

        Path stopFile = options.containsKey("stop-file") ? Path.of(options.get("stop-file")) : null;
        List<String> log = new ArrayList<>();
        AtomicLong processed = new AtomicLong();
        AtomicLong firstCall = new AtomicLong();
        emit("started", null);
        ParallelEoSStreamProcessor<byte[], byte[]> pc = new ParallelEoSStreamProcessor<>(
                ParallelConsumerOptions.<byte[], byte[]>builder()
                        .consumer(new KafkaConsumer<>(consumerProperties(bootstrap, group)))
                        .ordering(ProcessingOrder.valueOf(options.get("ordering")))
                        .commitMode(CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS)
                        .commitInterval(Duration.ofMillis(Long.parseLong(options.get("commit-interval-ms"))))
                        .maxConcurrency(Integer.parseInt(options.get("concurrency")))
                        .batchSize(Integer.parseInt(options.getOrDefault("batch-size", "1")))
                        .build());
        pc.subscribe(List.of(topic));
        pc.poll(context -> {
            if (firstCall.get() == 0 && firstCall.compareAndSet(0, 1)) {
                emit("first_call", null);
            }
            long started = System.nanoTime();
            doWork(work, ms);
            List<ConsumerRecord<byte[], byte[]>> records = context.getConsumerRecordsFlattened();
            double share = (System.nanoTime() - started) / 1e9 / records.size();
            Instant now = Instant.now();
            String doneAt = String.valueOf(now.getEpochSecond()) + "." + String.format("%06d", now.getNano() / 1000);
            synchronized (log) {
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    String key = record.key() == null ? "" : new String(record.key(), StandardCharsets.UTF_8);
                    log.add(record.partition() + "\t" + key + "\t" + record.offset() + "\t" + share + "\t" + doneAt);
                }
            }
            processed.addAndGet(records.size());
        });

        boolean reached = false;
        try (Admin admin = Admin.create(Map.<String, Object>of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            while (System.nanoTime() < deadline && !pc.isClosedOrFailed()
                    && (stopFile == null || !Files.exists(stopFile))) {
                if (processed.get() >= expected) {
                    Map<TopicPartition, OffsetAndMetadata> committed =
                            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
                    if (ends.entrySet().stream().allMatch(end -> end.getValue() == 0
                            || (committed.get(end.getKey()) != null
                            && committed.get(end.getKey()).offset() == end.getValue()))) {
                        reached = true;
                        emit("committed", null);
                        break;
                    }
                    Thread.sleep(5);
                } else {
                    Thread.sleep(1);
                }
            }
        } finally {
            if (!reached) {
                emit("failed", pc.getFailureCause() != null ? String.valueOf(pc.getFailureCause())
                        : "processed " + processed.get() + "/" + expected + " before the deadline");
            }
            pc.closeDontDrainFirst(Duration.ofSeconds(10));
        }
        try (BufferedWriter out = Files.newBufferedWriter(Path.of(options.get("out")))) {
            synchronized (log) {
                for (String line : log) {
                    out.write(line);
                    out.newLine();
                }
            }
        }
        System.exit(reached ? 0 : 1);
    }

    private static void doWork(String work, double ms) {
        try {
            switch (work) {
                case "noop" -> { }
                case "sleep_random" -> Thread.sleep(ThreadLocalRandom.current().nextInt((int) ms + 1));
                case "sleep" -> Thread.sleep((long) ms, (int) ((ms - Math.floor(ms)) * 1_000_000));
                default -> throw new IllegalArgumentException("unknown work " + work);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    private static synchronized void emit(String event, String reason) {
        Instant now = Instant.now();
        double t = now.getEpochSecond() + now.getNano() / 1e9;
        String extra = reason == null ? "" : ",\"reason\":\"" + reason.replace("\\", "\\\\").replace("\"", "'") + "\"";
        System.out.println("{\"event\":\"" + event + "\",\"t\":" + String.format("%.6f", t) + extra + "}");
        System.out.flush();
    }

    private static Properties consumerProperties(String bootstrap, String group) {
        Properties properties = new Properties();
        properties.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        properties.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        properties.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        properties.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        properties.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 10000);
        properties.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 1000);
        properties.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, 50);
        properties.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        properties.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        return properties;
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> options = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("unexpected argument " + args[i]);
            }
            options.put(args[i].substring(2), args[i + 1]);
        }
        for (String required : List.of("bootstrap", "topic", "group", "ends", "ordering",
                "concurrency", "commit-interval-ms", "work", "out")) {
            if (!options.containsKey(required)) {
                throw new IllegalArgumentException("missing --" + required);
            }
        }
        return options;
    }
}
