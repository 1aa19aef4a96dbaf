package outbox

// ScanSQL exposes the relay's scan statement to the tests.
func ScanSQL(s *Store) string { return s.sql.scanKafka }
