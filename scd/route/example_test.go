package route_test

import (
	"fmt"
	"math/rand/v2"

	"tpsched/scd/loadlevel"
	"tpsched/scd/route"
)

// A node with scd_this_node_first = Y keeps a request while it is not
// LEVEL2; with P2C and two candidates both are drawn and the lower level
// wins whatever the draw. A request that arrived balanced leaves only a
// LEVEL2 node, and a retry is bounded by the other nodes.
func Example() {
	rnd := rand.New(rand.NewPCG(1, 2))
	cands := []route.Candidate{
		{Node: "tp1", Local: true, Level: loadlevel.Level1},
		{Node: "tp2", Level: loadlevel.Level0, InFlight: 3},
	}
	tnf := route.Policy{Rule: route.OpenTP1, Announce: true, ThisNodeFirst: true, ScheduleRate: 50}
	fmt.Println("this node first:", cands[route.Choose(cands, tnf, route.Request{}, rnd)].Node)

	p2c := route.Policy{Rule: route.P2C, Announce: true, ScheduleRate: 50}
	fmt.Println("p2c:", cands[route.Choose(cands, p2c, route.Request{}, rnd)].Node)

	fmt.Println("transfer at LEVEL1:", route.Transfer(false, loadlevel.Level1, cands[1:], tnf))
	fmt.Println("transfer at LEVEL2:", route.Transfer(false, loadlevel.Level2, cands[1:], tnf))
	fmt.Println("retries (setting 5, 3 nodes):", route.Retries(5, 3))
	// Output:
	// this node first: tp1
	// p2c: tp2
	// transfer at LEVEL1: false
	// transfer at LEVEL2: true
	// retries (setting 5, 3 nodes): 2
}
