package io.confluent.parallelconsumer.offsets;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelConsumerOptions.CommitMode;
import io.confluent.parallelconsumer.ParallelConsumerOptions.ProcessingOrder;
import io.confluent.parallelconsumer.ParallelEoSStreamProcessor;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

import java.io.File;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;

/**
 * Runs the real Java Parallel Consumer on a topic for the hand-over tests of the Python port
 * (tests/compat/test_java_hand_over.py), then reports what it processed and what the group holds.
 *
 * <pre>
 * HandOverRunner --bootstrap HOST:PORT --topic T --group G --out OUT.json
 *                [--ordering KEY|UNORDERED|PARTITION] [--fail FILE] [--timeout SECONDS]
 *                [--force-codec ENCODING]
 *                (--until-succeeded N | --until-committed-end)
 * </pre>
 *
 * With --force-codec, every map the processor commits is in that OffsetEncoding (BitSet,
 * RunLengthV2Compressed, ...). The handler throws for every record listed in FAIL (lines "partition offset"), so those stay
 * unfinished (retried after 10 minutes, i.e. never during a run); every other record succeeds.
 * The runner closes the processor (which commits the offset and the offset map) once N records
 * have succeeded, or once the group's committed offsets reached the end of every partition with
 * no work left. OUT gets the records that succeeded, in order, and the group's committed offsets
 * and metadata as the Java client reads them (before the run and after it), with Java's own
 * decoding of each map.
 */
public final class HandOverRunner {

    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        Map<String, String> options = parse(args);
        String bootstrap = options.get("bootstrap");
        String topic = options.get("topic");
        String group = options.get("group");
        Set<String> failing = options.containsKey("fail")
                ? new HashSet<>(Files.readAllLines(Path.of(options.get("fail"))))
                : Set.of();
        long untilSucceeded = Long.parseLong(options.getOrDefault("until-succeeded", "-1"));
        boolean untilCommittedEnd = options.containsKey("until-committed-end");
        if (options.containsKey("force-codec")) {
            // The Java library's own test knobs: commit every map in this encoding (compressed
            // forms exist only when compression runs for every map).
            OffsetEncoding forced = OffsetEncoding.valueOf(options.get("force-codec"));
            OffsetMapCodecManager.forcedCodec = Optional.of(forced);
            OffsetSimultaneousEncoder.compressionForced = forced.name().endsWith("Compressed");
        }
        long deadline = System.nanoTime()
                + Duration.ofSeconds(Long.parseLong(options.getOrDefault("timeout", "60"))).toNanos();

        ObjectNode committedBefore = committedAsJavaReadsIt(bootstrap, group, topic);
        List<long[]> processed = new ArrayList<>();
        AtomicLong succeeded = new AtomicLong();
        AtomicLong attempts = new AtomicLong();
        ParallelEoSStreamProcessor<byte[], byte[]> pc = new ParallelEoSStreamProcessor<>(
                ParallelConsumerOptions.<byte[], byte[]>builder()
                        .consumer(new KafkaConsumer<>(consumerProperties(bootstrap, group)))
                        .ordering(ProcessingOrder.valueOf(options.getOrDefault("ordering", "UNORDERED")))
                        .commitMode(CommitMode.PERIODIC_CONSUMER_SYNC)
                        .commitInterval(Duration.ofMillis(200))
                        .maxConcurrency(8)
                        .defaultMessageRetryDelay(Duration.ofMinutes(10))
                        .build());
        pc.subscribe(List.of(topic));
        pc.poll(context -> {
            ConsumerRecord<byte[], byte[]> record = context.getSingleConsumerRecord();
            attempts.incrementAndGet();
            if (failing.contains(record.partition() + " " + record.offset())) {
                throw new IllegalStateException("deliberately unfinished: " + record.offset());
            }
            synchronized (processed) {
                processed.add(new long[]{record.partition(), record.offset()});
            }
            succeeded.incrementAndGet();
        });

        boolean reached = false;
        String failure = null;
        try (Admin admin = Admin.create(
                Map.<String, Object>of(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap))) {
            Map<TopicPartition, Long> ends =
                    untilCommittedEnd ? endOffsets(admin, bootstrap, topic) : Map.of();
            while (System.nanoTime() < deadline && !pc.isClosedOrFailed()) {
                if (untilSucceeded >= 0 && succeeded.get() >= untilSucceeded) {
                    reached = true;
                    break;
                }
                if (untilCommittedEnd && pc.workRemaining() == 0) {
                    Map<TopicPartition, OffsetAndMetadata> committed =
                            admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get();
                    if (ends.entrySet().stream().allMatch(end -> committed.get(end.getKey()) != null
                            && committed.get(end.getKey()).offset() == end.getValue())) {
                        reached = true;
                        break;
                    }
                }
                Thread.sleep(50);
            }
        } finally {
            if (pc.getFailureCause() != null) {
                failure = String.valueOf(pc.getFailureCause());
            }
            pc.closeDontDrainFirst(Duration.ofSeconds(10));
        }

        ObjectNode result = JSON.createObjectNode();
        result.put("reached", reached);
        result.put("failure", failure);
        result.put("succeeded", succeeded.get());
        result.put("attempts", attempts.get());
        ArrayNode records = result.putArray("processed");
        synchronized (processed) {
            for (long[] record : processed) {
                records.addArray().add(record[0]).add(record[1]);
            }
        }
        result.set("committed_before", committedBefore);
        result.set("committed", committedAsJavaReadsIt(bootstrap, group, topic));
        JSON.writerWithDefaultPrettyPrinter().writeValue(new File(options.get("out")), result);
    }

    /** The group's commit as the Java client returns it, metadata byte for byte, and decoded. */
    private static ObjectNode committedAsJavaReadsIt(String bootstrap, String group, String topic) {
        ObjectNode partitions = JSON.createObjectNode();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProperties(bootstrap, group))) {
            Set<TopicPartition> all = consumer.partitionsFor(topic).stream()
                    .map(info -> new TopicPartition(topic, info.partition()))
                    .collect(Collectors.toSet());
            for (Map.Entry<TopicPartition, OffsetAndMetadata> entry : consumer.committed(all).entrySet()) {
                ObjectNode partition = partitions.putObject(String.valueOf(entry.getKey().partition()));
                if (entry.getValue() == null) {
                    partition.putNull("offset");
                    continue;
                }
                long offset = entry.getValue().offset();
                String metadata = entry.getValue().metadata();
                partition.put("offset", offset);
                partition.put("metadata", metadata);
                ArrayNode chars = partition.putArray("metadata_last_chars");
                for (int i = Math.max(0, metadata.length() - 3); i < metadata.length(); i++) {
                    chars.add((int) metadata.charAt(i));
                }
                if (metadata.isEmpty()) {
                    continue;
                }
                ObjectNode decoded = partition.putObject("java_decoded");
                try {
                    OffsetMapCodecManager.HighestOffsetAndIncompletes map =
                            OffsetMapCodecManager.deserialiseIncompleteOffsetMapFromBase64(offset, metadata);
                    decoded.put("highest_seen", map.getHighestSeenOffset().orElse(null));
                    ArrayNode incompletes = decoded.putArray("incompletes");
                    map.getIncompleteOffsets().stream().sorted().forEach(incompletes::add);
                } catch (Exception e) {
                    decoded.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
                }
            }
        }
        return partitions;
    }

    private static Map<TopicPartition, Long> endOffsets(Admin admin, String bootstrap, String topic) throws Exception {
        Map<TopicPartition, OffsetSpec> latest = new HashMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProperties(bootstrap, "unused"))) {
            for (PartitionInfo info : consumer.partitionsFor(topic)) {
                latest.put(new TopicPartition(topic, info.partition()), OffsetSpec.latest());
            }
        }
        Map<TopicPartition, Long> ends = new HashMap<>();
        admin.listOffsets(latest).all().get().forEach((partition, info) -> ends.put(partition, info.offset()));
        return ends;
    }

    private static Properties consumerProperties(String bootstrap, String group) {
        Properties properties = new Properties();
        properties.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        properties.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        properties.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        properties.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        properties.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 6000);
        properties.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
        properties.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, 50);
        properties.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        properties.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        return properties;
    }

    private static Map<String, String> parse(String[] args) {
        Map<String, String> options = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("unexpected argument " + args[i]);
            }
            String name = args[i].substring(2);
            boolean flag = i + 1 == args.length || args[i + 1].startsWith("--");
            options.put(name, flag ? "" : args[++i]);
        }
        for (String required : List.of("bootstrap", "topic", "group", "out")) {
            if (!options.containsKey(required)) {
                throw new IllegalArgumentException("missing --" + required);
            }
        }
        return options;
    }
}
