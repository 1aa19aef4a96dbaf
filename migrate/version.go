package migrate

import (
	"context"
	"errors"
	"fmt"
)

// MinServerVersion is the oldest PostgreSQL major version idemkit supports:
// its migrations and queries use nothing newer. Up refuses an older server.
const MinServerVersion = 14

// ErrServerTooOld is matched (errors.Is) by the error Up returns for a server
// older than MinServerVersion.
var ErrServerTooOld = errors.New("migrate: PostgreSQL server older than idemkit supports")

// ServerVersionError is the error Up returns, before it changes anything,
// when the server is older than MinServerVersion. It matches ErrServerTooOld.
type ServerVersionError struct {
	// Server is the server's version as it reports it (server_version),
	// such as "13.16".
	Server string
	// Num is its server_version_num, such as 130016.
	Num int
}

func (e *ServerVersionError) Error() string {
	return fmt.Sprintf("PostgreSQL %s is older than PostgreSQL %d, the oldest version idemkit supports", e.Server, MinServerVersion)
}

// Is reports whether target is ErrServerTooOld.
func (e *ServerVersionError) Is(target error) bool { return target == ErrServerTooOld }

// checkServerVersion returns a *ServerVersionError when num, a
// server_version_num, is older than MinServerVersion; server is the
// matching server_version, for the message.
func checkServerVersion(num int, server string) error {
	if num < MinServerVersion*10000 {
		return &ServerVersionError{Server: server, Num: num}
	}
	return nil
}

// readServerVersion returns the server's server_version_num and
// server_version.
func readServerVersion(ctx context.Context, q querier) (num int, server string, err error) {
	err = q.QueryRow(ctx, "SELECT current_setting('server_version_num')::int, current_setting('server_version')").
		Scan(&num, &server)
	if err != nil {
		return 0, "", fmt.Errorf("server version: %w", err)
	}
	return num, server, nil
}

// checkServer refuses a server older than MinServerVersion.
func (m *Migrator) checkServer(ctx context.Context) error {
	num, server, err := m.serverVersion(ctx)
	if err != nil {
		return err
	}
	return checkServerVersion(num, server)
}
