package consumer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/segmentio/kafka-go"
)

// IDFromJSON returns a Config.IDFunc that takes the message ID from the
// top-level member name of the message's value, a JSON object: a string,
// or a number kept as written ({"event_id": "e-42"} or {"seq": 42}). It
// reads the value only as far as that member and does not keep what it
// read. A value that is not a JSON object, or whose member is missing, null,
// empty or of another type, has no usable ID (see Config.MissingID).
func IDFromJSON(name string) func(msg *kafka.Message) (string, error) {
	return func(msg *kafka.Message) (string, error) {
		d := json.NewDecoder(bytes.NewReader(msg.Value))
		d.UseNumber()
		if t, err := d.Token(); err != nil || t != json.Delim('{') {
			return "", fmt.Errorf("the value is not a JSON object")
		}
		for d.More() {
			t, err := d.Token()
			if err != nil {
				return "", fmt.Errorf("the value is not valid JSON: %w", err)
			}
			if key, _ := t.(string); key != name {
				var skip json.RawMessage
				if err := d.Decode(&skip); err != nil {
					return "", fmt.Errorf("the value is not valid JSON: %w", err)
				}
				continue
			}
			t, err = d.Token()
			switch v := t.(type) {
			case string:
				if v == "" {
					return "", fmt.Errorf("member %q is empty", name)
				}
				return v, nil
			case json.Number:
				return v.String(), nil
			case nil:
				if err != nil && !errors.Is(err, io.EOF) {
					return "", fmt.Errorf("the value is not valid JSON: %w", err)
				}
				return "", fmt.Errorf("member %q is null", name)
			default:
				return "", fmt.Errorf("member %q is not a string or a number", name)
			}
		}
		return "", fmt.Errorf("no member %q", name)
	}
}
