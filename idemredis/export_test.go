package idemredis

// Waiters returns how many requests wait through the store's shared
// subscription, for tests.
func (s *Store) Waiters() int {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.hub.n
}
