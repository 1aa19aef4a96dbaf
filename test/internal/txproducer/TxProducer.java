// TxProducer writes to Kafka with Kafka's own transactional producer
// (transactional.id, enable.idempotence), driven line by line from stdin so
// that a Go test can open, fill, commit, abort or leave open transactions of
// several producers in any interleaving.
//
// Usage: java -cp '<kafka libs>/*' TxProducer.java <bootstrap>
//
// Commands, one a line, fields separated by one space; every command answers
// one line on stdout, "ok" (with data) or "err <message>":
//
//	producer <name> <transactional.id> <compression>  create and initTransactions
//	begin <name>                                       beginTransaction
//	send <name> <topic> <partition> <key> <value> <id> [<hkey> <hvalue>]...
//	                                                   queue a record (not sent yet);
//	                                                   key, value, id and the
//	                                                   header pairs are base64
//	                                                   (URL, no padding), "-"
//	                                                   for none; id goes in the
//	                                                   "message-id" header, each
//	                                                   pair in a header after it
//	flush <name>                                       send what is queued:
//	                                                   "ok <offset>..." of the
//	                                                   records queued since the
//	                                                   last flush, in order
//	commit <name>                                      flush, commitTransaction
//	abort <name>                                       flush, abortTransaction
//	close <name>                                       close the producer
//	quit                                               close all and exit
//
// Records queued between two flushes of a producer go out together: one
// batch per partition (linger.ms is long, so only a flush sends).
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class TxProducer {
    private static final class Named {
        final KafkaProducer<byte[], byte[]> producer;
        final List<Future<RecordMetadata>> pending = new ArrayList<>();

        Named(KafkaProducer<byte[], byte[]> producer) {
            this.producer = producer;
        }

        String flush() throws Exception {
            producer.flush();
            StringBuilder out = new StringBuilder("ok");
            for (Future<RecordMetadata> f : pending) {
                out.append(' ').append(f.get().offset());
            }
            pending.clear();
            return out.toString();
        }
    }

    private static byte[] decode(String field) {
        if (field.equals("-")) {
            return null;
        }
        return Base64.getUrlDecoder().decode(field);
    }

    public static void main(String[] args) throws Exception {
        // Answers go to stdout; everything else (the client's logs) to stderr.
        PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        System.setOut(System.err);
        String bootstrap = args[0];
        Map<String, Named> producers = new HashMap<>();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        out.println("ok ready");
        for (String line; (line = in.readLine()) != null; ) {
            String[] f = line.split(" ", -1); // -1: keep empty trailing fields (empty values)
            String answer;
            try {
                answer = run(bootstrap, producers, f);
            } catch (Exception e) {
                Throwable c = e;
                while (c.getCause() != null) {
                    c = c.getCause();
                }
                answer = "err " + f[0] + ": " + e + (c != e ? " (cause: " + c + ")" : "");
                answer = answer.replace('\n', ' ');
            }
            out.println(answer);
            if (f[0].equals("quit")) {
                return;
            }
        }
        for (Named n : producers.values()) {
            n.producer.close(Duration.ofSeconds(5));
        }
    }

    private static String run(String bootstrap, Map<String, Named> producers, String[] f) throws Exception {
        switch (f[0]) {
            case "producer": {
                Properties p = new Properties();
                p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
                p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, f[2]);
                p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
                p.put(ProducerConfig.ACKS_CONFIG, "all");
                p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, f[3]);
                p.put(ProducerConfig.LINGER_MS_CONFIG, "600000");
                p.put(ProducerConfig.BATCH_SIZE_CONFIG, "1048576");
                p.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, "300000");
                p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
                p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
                KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);
                try {
                    producer.initTransactions();
                } catch (Exception e) {
                    producer.close(Duration.ZERO);
                    throw e;
                }
                producers.put(f[1], new Named(producer));
                return "ok";
            }
            case "begin":
                get(producers, f[1]).producer.beginTransaction();
                return "ok";
            case "send": {
                Named n = get(producers, f[1]);
                ProducerRecord<byte[], byte[]> r = new ProducerRecord<>(f[2], Integer.parseInt(f[3]),
                    decode(f[4]), decode(f[5]));
                byte[] id = decode(f[6]);
                if (id != null) {
                    r.headers().add("message-id", id);
                }
                for (int i = 7; i + 1 < f.length; i += 2) {
                    r.headers().add(new String(decode(f[i]), StandardCharsets.UTF_8), decode(f[i + 1]));
                }
                n.pending.add(n.producer.send(r));
                return "ok";
            }
            case "flush":
                return get(producers, f[1]).flush();
            case "commit": {
                Named n = get(producers, f[1]);
                String offsets = n.flush();
                n.producer.commitTransaction();
                return offsets;
            }
            case "abort": {
                Named n = get(producers, f[1]);
                String offsets = n.flush();
                n.producer.abortTransaction();
                return offsets;
            }
            case "close": {
                Named n = producers.remove(f[1]);
                if (n != null) {
                    n.producer.close(Duration.ofSeconds(5));
                }
                return "ok";
            }
            case "quit":
                for (Named n : producers.values()) {
                    n.producer.close(Duration.ofSeconds(5));
                }
                producers.clear();
                return "ok";
            default:
                throw new IllegalArgumentException("unknown command " + f[0]);
        }
    }

    private static Named get(Map<String, Named> producers, String name) {
        Named n = producers.get(name);
        if (n == null) {
            throw new IllegalArgumentException("no producer " + name);
        }
        return n;
    }
}
