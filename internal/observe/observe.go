// Package observe sorts the values of a config's Observers list by the
// observer interfaces they implement.
package observe

// Take appends v to list when v implements T, and says whether it did (1)
// or not (0): a value may implement several observer interfaces, and one
// that implements none is a configuration error.
func Take[T any](v any, list *[]T) int {
	x, ok := v.(T)
	if !ok {
		return 0
	}
	*list = append(*list, x)
	return 1
}
