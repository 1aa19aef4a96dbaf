package migrate

import "context"

// CheckServerVersion is checkServerVersion, for the tests of package
// migrate_test.
var CheckServerVersion = checkServerVersion

// SetServerVersion makes m read the server's version with f.
func SetServerVersion(m *Migrator, f func(ctx context.Context) (num int, server string, err error)) {
	m.serverVersion = f
}
