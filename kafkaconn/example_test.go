package kafkaconn_test

import (
	"log"
	"os"

	"github.com/idemkit/idemkit/kafkaconn"
)

// A SASL_SSL cluster: TLS with the cluster's CA, SCRAM-SHA-512. The Config
// goes to every part of idemkit that talks to Kafka.
func ExampleLoadTLS() {
	tlsConf, err := kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: "/etc/kafka/ca.pem"}) // empty CA: the system's roots
	if err != nil {
		log.Fatal(err) // names the unreadable file
	}
	kc := kafkaconn.Config{
		Brokers: []string{"kafka-1:9094", "kafka-2:9094"},
		TLS:     tlsConf,
		SASL:    &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: "orders", Password: os.Getenv("KAFKA_PASSWORD")},
	}
	_ = kc
}
