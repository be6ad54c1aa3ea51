package io.confluent.parallelconsumer.offsets;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;

import java.io.File;
import java.util.Base64;
import java.util.Map;
import java.util.SortedSet;
import java.util.TreeSet;

/**
 * Runs the real Java Parallel Consumer offset codec for the Python port's compatibility tests.
 *
 * <pre>
 * encode IN OUT: IN is [{name, base, highest, incompletes}]; for each vector, writes every
 *                encoding Java produces (compression forced on, so all eight are present when
 *                they fit), Java's own pick with default settings, and Java's decoding of each.
 * decode IN OUT: IN is [{name, committed, metadata}]; writes Java's decoding of each string.
 * </pre>
 *
 * Lives in the library's package to reach the package-private encoding map.
 */
public final class CompatHarness {

    private static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            throw new IllegalArgumentException("usage: encode|decode IN.json OUT.json");
        }
        JsonNode input = JSON.readTree(new File(args[1]));
        ArrayNode output = JSON.createArrayNode();
        for (JsonNode item : input) {
            switch (args[0]) {
                case "encode" -> output.add(encode(item));
                case "decode" -> output.add(decode(item.get("name").asText(),
                        item.get("committed").asLong(), item.get("metadata").asText()));
                default -> throw new IllegalArgumentException("unknown mode " + args[0]);
            }
        }
        JSON.writerWithDefaultPrettyPrinter().writeValue(new File(args[2]), output);
    }

    private static ObjectNode encode(JsonNode vector) throws Exception {
        long base = vector.get("base").asLong();
        long highest = vector.get("highest").asLong();
        // PartitionState passes only the incompletes strictly below the highest succeeded offset.
        SortedSet<Long> incompletes = new TreeSet<>();
        for (JsonNode offset : vector.get("incompletes")) {
            if (offset.asLong() < highest) {
                incompletes.add(offset.asLong());
            }
        }
        ObjectNode result = JSON.createObjectNode();
        result.put("name", vector.get("name").asText());
        result.put("base", base);
        result.put("highest", highest);
        result.set("incompletes", vector.get("incompletes"));

        OffsetSimultaneousEncoder.compressionForced = false;
        OffsetSimultaneousEncoder chooser = new OffsetSimultaneousEncoder(base, highest, incompletes).invoke();
        try {
            byte[] smallest = chooser.packSmallest();
            result.put("java_choice", OffsetEncoding.decode(smallest[0]).name());
            result.put("java_choice_metadata", Base64.getEncoder().encodeToString(smallest));
        } catch (NoEncodingPossibleException e) {
            result.putNull("java_choice");
        }

        OffsetSimultaneousEncoder.compressionForced = true;
        OffsetSimultaneousEncoder all = new OffsetSimultaneousEncoder(base, highest, incompletes).invoke();
        OffsetSimultaneousEncoder.compressionForced = false;
        ObjectNode encodings = JSON.createObjectNode();
        for (Map.Entry<OffsetEncoding, byte[]> entry : all.getEncodingMap().entrySet()) {
            byte[] data = entry.getValue();
            byte[] payload = new byte[data.length + 1];
            payload[0] = entry.getKey().magicByte;
            System.arraycopy(data, 0, payload, 1, data.length);
            String metadata = Base64.getEncoder().encodeToString(payload);
            ObjectNode encoded = JSON.createObjectNode();
            encoded.put("metadata", metadata);
            encoded.set("java_decoded", decode(null, base, metadata));
            encodings.set(entry.getKey().name(), encoded);
        }
        result.set("encodings", encodings);
        return result;
    }

    private static ObjectNode decode(String name, long committed, String metadata) {
        ObjectNode result = JSON.createObjectNode();
        if (name != null) {
            result.put("name", name);
        }
        try {
            OffsetMapCodecManager.HighestOffsetAndIncompletes decoded =
                    OffsetMapCodecManager.deserialiseIncompleteOffsetMapFromBase64(committed, metadata);
            if (decoded.getHighestSeenOffset().isPresent()) {
                result.put("highest_seen", decoded.getHighestSeenOffset().get());
            } else {
                result.putNull("highest_seen");
            }
            ArrayNode offsets = result.putArray("incompletes");
            decoded.getIncompleteOffsets().forEach(offsets::add);
        } catch (Exception e) {
            result.put("error", e.getClass().getSimpleName() + ": " + e.getMessage());
        }
        return result;
    }
}
