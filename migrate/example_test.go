package migrate_test

import (
	"context"
	"fmt"

	"github.com/idemkit/idemkit/migrate"
)

func ExampleMigrator_Up() {
	ctx := context.Background()
	pool, schema, drop := exampleDB() // a pgxpool.Pool on the test server
	defer drop()

	m, err := migrate.New(pool, &migrate.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	applied, err := m.Up(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("applied:", applied)

	applied, err = m.Up(ctx) // idempotent: nothing left to apply
	if err != nil {
		panic(err)
	}
	fmt.Println("applied again:", applied)

	versions, err := m.Versions(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("versions:", versions, "latest:", m.Latest())
	// Output:
	// applied: [1]
	// applied again: []
	// versions: [1] latest: 1
}
