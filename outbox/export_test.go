package outbox

// ReadSQL exposes the relay's read statement to the tests: $1 is the limit,
// $2 the mask of the shards held (-1: all).
func ReadSQL(s *Store) string { return s.sql.read }

// HandlerScanSQL exposes the dispatcher's scan statement to the tests: $1 is
// the limit, $2 the handler name.
func HandlerScanSQL(s *Store) string { return s.sql.scanHandler }

// OnRound sets a hook that runs after each relay round that read rows, with
// the number of messages it delivered. Call it before Run.
func OnRound(r *Relay, f func(delivered int)) { r.onRound = f }

// ShardNamespace is the first key of the advisory locks of the relays'
// shards on the store's table.
func ShardNamespace(s *Store) int32 { return s.shardNS }
