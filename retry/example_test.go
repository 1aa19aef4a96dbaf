package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemkit/idemkit/retry"
)

func ExamplePolicy_Do() {
	p := &retry.Policy{InitialInterval: time.Millisecond, MaxAttempts: 5}
	calls := 0
	err := p.Do(context.Background(), func(ctx context.Context) error {
		calls++
		if calls < 3 {
			return errors.New("provider timeout") // transient: retried
		}
		return nil
	}, func(err error, attempt int, wait time.Duration) {
		fmt.Printf("attempt %d failed: %v\n", attempt, err)
	})
	fmt.Println("err:", err, "after", calls, "calls")
	// Output:
	// attempt 1 failed: provider timeout
	// attempt 2 failed: provider timeout
	// err: <nil> after 3 calls
}

func ExamplePermanent() {
	p := &retry.Policy{InitialInterval: time.Millisecond}
	calls := 0
	err := p.Do(context.Background(), func(ctx context.Context) error {
		calls++
		return retry.Permanent(errors.New("card declined")) // never retried
	}, nil)
	var rerr *retry.Error
	fmt.Println(errors.As(err, &rerr), rerr.Class, rerr.Attempts, calls)
	// Output:
	// true permanent 1 1
}

func ExamplePolicy_Schedule() {
	// The jitter's random source is injectable: here it always draws the
	// middle of the range, so the schedule is the plain exponential one.
	p := &retry.Policy{InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, MaxAttempts: 6,
		Rand: func() float64 { return 0.5 }}
	s := p.Schedule()
	for {
		wait, ok := s.Next()
		if !ok {
			fmt.Println("give up")
			break
		}
		fmt.Print(wait, " ")
	}
	// Output:
	// 100ms 200ms 400ms 800ms 1s give up
}
