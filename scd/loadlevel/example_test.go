package loadlevel_test

import (
	"fmt"
	"time"

	"tpsched/scd/loadlevel"
)

// Two groups checked every 3 s and 5 s: the node ticks every second and
// checks each group on its own ticks.
func Example() {
	sched, err := loadlevel.NewSchedule([]time.Duration{3 * time.Second, 5 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	samplers := []*loadlevel.Sampler{
		loadlevel.NewSampler(loadlevel.Counters{}, nil),
		loadlevel.NewSampler(loadlevel.Counters{}, &loadlevel.Thresholds{U1: 5, U2: 10, D0: 2, D1: 8}),
	}
	// What each queue's counters read at ticks 3, 5 and 6.
	counters := map[uint64][]loadlevel.Counters{
		3: {{Queued: 10, Processed: 2, Depth: 8}},
		5: {{}, {Queued: 20, Processed: 14, Depth: 6}},
		6: {{Queued: 12, Processed: 12, Depth: 0}},
	}
	fmt.Println("tick", sched.Tick())
	for n := uint64(1); n <= 6; n++ {
		for g, m := range samplers {
			if !sched.Due(g, n) {
				continue
			}
			r := m.Check(counters[n][g])
			x, _ := r.Sample.ProcessingRate()
			fmt.Printf("tick %d group %d: %v -> %v (Q=%d q=%d X=%.0f)\n",
				n, g, r.From, r.To, r.Sample.Queued, r.Sample.Remaining, x)
		}
	}
	// Output:
	// tick 1s
	// tick 3 group 0: LEVEL0 -> LEVEL1 (Q=10 q=8 X=11)
	// tick 5 group 1: LEVEL0 -> LEVEL1 (Q=20 q=6 X=54)
	// tick 6 group 0: LEVEL1 -> LEVEL0 (Q=2 q=0 X=500)
}
