package outbox

// ScanSQL exposes the relay's scan statement to the tests: $1 is the limit.
func ScanSQL(s *Store) string { return s.sql.scanKafka }

// HandlerScanSQL exposes the dispatcher's scan statement to the tests: $1 is
// the limit, $2 the handler name.
func HandlerScanSQL(s *Store) string { return s.sql.scanHandler }
