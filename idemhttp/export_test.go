package idemhttp

// LockKey exposes, to this package's tests, the advisory lock key a
// request in transaction mode holds its key with.
func (s *Store) LockKey(account, operation, key string) int64 {
	return s.lockKey(account, operation, key)
}

// OnMismatchLook makes s call f after each look that finds a key held by a
// request with another fingerprint.
func (s *Store) OnMismatchLook(f func()) {
	s.mismatchLooked = f
}
