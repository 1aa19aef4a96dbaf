package dedup

import (
	"embed"
	"fmt"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/migrate"
)

// sqlFiles are the store's statements, one per query, each in a file
// named after it; position.sql and position_columns.sql hold the parts
// several statements share.
//
//go:embed sql/*.sql
var sqlFiles embed.FS

// statements is the store's SQL with its tables' names filled in, made once
// by newStatements.
type statements struct {
	claim, claimDaily                           string
	claimWithPosition, claimWithPositionDaily   string
	claimBatch, claimBatchPartition             string
	movePosition, savePosition                  string
	processed, processedDaily                   string
	purge, purgeConsumer                        string
	listPositions, lockPositions, seekPositions string
	readLayout                                  string
}

// newStatements renders every statement for the tables of mc (with
// defaults applied) and daily.
func newStatements(mc migrate.Tables, daily dailyNames) (statements, error) {
	quoted := func(name string) func() string {
		q := pgx.Identifier{mc.Schema, name}.Sanitize()
		return func() string { return q }
	}
	t, err := template.New("dedup").Option("missingkey=error").Funcs(template.FuncMap{
		"processed": quoted(mc.ProcessedMessages),
		"positions": quoted(mc.ConsumerPositions),
		"daily":     func() string { return daily.table },
		"layout":    func() string { return daily.layout },
	}).ParseFS(sqlFiles, "sql/*.sql")
	if err != nil {
		return statements{}, fmt.Errorf("dedup: parse statements: %w", err)
	}
	var st statements
	for name, dst := range map[string]*string{
		"claim": &st.claim, "claim_daily": &st.claimDaily,
		"claim_with_position": &st.claimWithPosition, "claim_with_position_daily": &st.claimWithPositionDaily,
		"claim_batch": &st.claimBatch, "claim_batch_partition": &st.claimBatchPartition,
		"move_position": &st.movePosition, "save_position": &st.savePosition,
		"processed": &st.processed, "processed_daily": &st.processedDaily,
		"purge": &st.purge, "purge_consumer": &st.purgeConsumer,
		"list_positions": &st.listPositions, "lock_positions": &st.lockPositions, "seek_positions": &st.seekPositions,
		"read_layout": &st.readLayout,
	} {
		var b strings.Builder
		if err := t.ExecuteTemplate(&b, name+".sql", nil); err != nil {
			return statements{}, fmt.Errorf("dedup: render %s: %w", name, err)
		}
		*dst = strings.TrimSpace(b.String())
	}
	return st, nil
}
