package migrate_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/idemkit/idemkit/migrate"
)

func ExampleMigrator_Up() {
	ctx := context.Background()
	pool, schema, drop := exampleDB() // a pgxpool.Pool on the test server
	defer drop()

	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	applied, err := m.Up(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("applied every known version:", slices.Equal(applied, migrate.Known()))

	applied, err = m.Up(ctx) // idempotent: nothing left to apply
	if err != nil {
		panic(err)
	}
	fmt.Println("applied again:", applied)

	versions, err := m.Versions(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("recorded:", slices.Equal(versions, migrate.Known()), "latest:", m.Latest() == versions[len(versions)-1])
	// Output:
	// applied every known version: true
	// applied again: []
	// recorded: true latest: true
}
