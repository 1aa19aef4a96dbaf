// Package kafkaconn is idemkit's one Kafka connection setting: where the
// brokers are and how to reach them (TLS, SASL PLAIN or SCRAM, client ID,
// dial timeout). Every package that talks to Kafka takes a Config — the
// consumer (consumer.Config.Kafka), the outbox relay (outbox.RelayConfig.Kafka),
// the dead-letter writer and reprocessor (dlq.WriterConfig.Kafka,
// dlq.ReprocessorConfig.Kafka), dlq.Scan and CreateTopic — and the
// idemkit CLI builds one from its -brokers and -kafka-* flags (or their
// IDEMKIT_KAFKA_* variables). Say it once, pass it everywhere:
//
//	tlsConf, err := kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: "/etc/kafka/ca.pem"})
//	if err != nil { ... }
//	kc := kafkaconn.Config{
//		Brokers: []string{"kafka-1:9094", "kafka-2:9094"},
//		TLS:     tlsConf,
//		SASL:    &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: "orders", Password: secret},
//	}
//	runner, err := consumer.New(pool, &consumer.Config{Kafka: kc, Topic: "payments", ...})
//	relay, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{Kafka: kc})
//
// ExampleLoadTLS builds the Config of a SASL_SSL cluster (the cluster's CA,
// SCRAM-SHA-512).
//
// A Config is checked by Validate, which every constructor calls: an
// unknown mechanism, SASL without a username or password, a TLS client
// certificate without its key are errors wrapping ErrInvalidConfig before
// anything connects. Dialer and Transport build what kafka-go needs from it
// (a *kafka.Dialer for consumer groups and readers, a *kafka.Transport for
// writers and clients).
//
// Connections give up on silence: every connection probes a silent broker
// with TCP keepalives (after 15s, every 5s, dropped after 3 unanswered:
// 30s), and every request idemkit sends is bounded by a timeout of its own
// (kafka-go sets it as the connection's read and write deadline and drops
// the connection when it passes), so a request on a connection that went
// silent is abandoned and sent again on a new one. Dial replaces the
// dialer (a tunnel, a proxy).
//
// A broker that rejects the credentials, or whose certificate the client
// does not trust, is not an outage: Wrap turns such errors into an *Error
// naming the brokers that matches ErrAuthentication or ErrTLS: the
// consumer (joining the group and fetching), a dead-letter write and a
// replay stop with it instead of waiting for the broker to come back; the
// outbox relay keeps the rows and retries them (they are only published
// late), logging each failure. Passwords are never part of an error (also
// when SASLprep refuses one), a log line or String.
package kafkaconn
