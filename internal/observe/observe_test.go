package observe_test

import (
	"testing"

	"github.com/idemkit/idemkit/internal/observe"
)

type a interface{ A() }
type b interface{ B() }

type both struct{}

func (both) A() {}
func (both) B() {}

type onlyA struct{}

func (onlyA) A() {}

func TestTake(t *testing.T) {
	var as []a
	var bs []b
	for _, v := range []any{both{}, onlyA{}, 42} {
		n := observe.Take(v, &as) + observe.Take(v, &bs)
		want := map[any]int{both{}: 2, onlyA{}: 1, 42: 0}[v]
		if n != want {
			t.Errorf("%T implements %d of the interfaces, Take said %d", v, want, n)
		}
	}
	if len(as) != 2 || len(bs) != 1 {
		t.Fatalf("as = %v, bs = %v: want both and onlyA in as, both in bs", as, bs)
	}
}
