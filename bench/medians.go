package bench

import (
	"math"
	"reflect"
	"slices"
)

// Every scenario summarises its runs the same way: each figure is its own
// median across the runs, and one run (the median by some figure) is the
// one drawn. medianOf does the first for any figures struct, so a
// scenario's figures are data (a struct) and not also a function.

// medianOf takes the median across runs of every number in T: float64
// fields, those of embedded and nested structs, and each element of
// []float64 and [][N]float64 fields (as long as the first run's). A field
// tagged median:"never" holds a time where -1 means never, which ranks
// above every time. Fields of other kinds are left zero.
func medianOf[T any](runs []T) T {
	var out T
	if len(runs) == 0 {
		return out
	}
	vals := make([]reflect.Value, len(runs))
	for i := range runs {
		vals[i] = reflect.ValueOf(&runs[i]).Elem()
	}
	medianInto(reflect.ValueOf(&out).Elem(), vals, false)
	return out
}

func medianInto(dst reflect.Value, runs []reflect.Value, never bool) {
	switch dst.Kind() {
	case reflect.Float64:
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = r.Float()
		}
		if never {
			dst.SetFloat(medianNever(v))
		} else {
			dst.SetFloat(median(v))
		}
	case reflect.Struct:
		t := dst.Type()
		for f := range t.NumField() {
			if !t.Field(f).IsExported() {
				continue
			}
			field := make([]reflect.Value, len(runs))
			for i, r := range runs {
				field[i] = r.Field(f)
			}
			medianInto(dst.Field(f), field, t.Field(f).Tag.Get("median") == "never")
		}
	case reflect.Slice:
		if runs[0].IsNil() {
			return
		}
		n := runs[0].Len()
		dst.Set(reflect.MakeSlice(dst.Type(), n, n))
		zero := reflect.Zero(dst.Type().Elem())
		for k := range n {
			elem := make([]reflect.Value, len(runs))
			for i, r := range runs {
				elem[i] = zero
				if k < r.Len() {
					elem[i] = r.Index(k)
				}
			}
			medianInto(dst.Index(k), elem, never)
		}
	case reflect.Array:
		for k := range dst.Len() {
			elem := make([]reflect.Value, len(runs))
			for i, r := range runs {
				elem[i] = r.Index(k)
			}
			medianInto(dst.Index(k), elem, never)
		}
	}
}

// medianNever is the median of times where -1 means "never", which ranks
// above every time.
func medianNever(v []float64) float64 {
	x := make([]float64, len(v))
	for i, t := range v {
		x[i] = t
		if t < 0 {
			x[i] = math.Inf(1)
		}
	}
	m := median(x)
	if math.IsInf(m, 1) {
		return -1
	}
	return m
}

// medianRun is the index of the run whose key is the median (the lower
// middle of an even count; the first of equals), or -1 for no runs.
func medianRun[T any](runs []T, key func(T) float64) int {
	if len(runs) == 0 {
		return -1
	}
	order := make([]int, len(runs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmpFloat(key(runs[a]), key(runs[b])) })
	return order[(len(order)-1)/2]
}
