// DeleteRecords deletes the records of a partition below an offset, as
// Kafka's retention does, with Kafka's own admin client (kafka-go has no
// DeleteRecords). Usage: java -cp '<kafka libs>/*' DeleteRecords.java
// <bootstrap> <topic> <partition> <before-offset>
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.common.TopicPartition;

public class DeleteRecords {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (Admin admin = Admin.create(props)) {
            TopicPartition tp = new TopicPartition(args[1], Integer.parseInt(args[2]));
            long low = admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(Long.parseLong(args[3]))))
                .lowWatermarks().get(tp).get().lowWatermark();
            System.out.println(low);
        }
    }
}
