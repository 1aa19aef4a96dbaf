package idemhttp

// LockKey exposes, to this package's tests, the advisory lock key a
// request in transaction mode holds its key with.
func (s *Store) LockKey(account, operation, key string) int64 {
	return s.lockKey(account, operation, key)
}
