package wlm

import (
	"slices"
	"time"
)

// Classes is how one service group's calls are classified and measured
// under one policy: the class of each of its services, and what the calls
// of each class took in the interval under way. The group's scheduler
// holds it and calls Of at a call's admission and Record at its answer,
// under the group's lock; the routing manager takes the interval's figures
// (Take) under the same lock. A group without a policy has NoClasses:
// every call is of class 0, and nothing is recorded.
type Classes struct {
	byService map[string]uint16 // never modified: read without a lock
	dflt      uint16            // the class of a service not in byService (refused anyway)
	goals     []Goal            // by class index
	cur       []Sample          // this interval's calls, by class
}

// NoClasses is the Classes of a group under no policy.
func NoClasses() *Classes { return &Classes{} }

// NewClasses classifies the services of group under p.
func NewClasses(p *Policy, group string, services []string) *Classes {
	c := &Classes{byService: make(map[string]uint16, len(services)), cur: make([]Sample, len(p.Classes))}
	c.dflt = uint16(p.Classify(group, ""))
	for _, cl := range p.Classes {
		c.goals = append(c.goals, cl.Goal)
	}
	for _, s := range services {
		c.byService[s] = uint16(p.Classify(group, s))
	}
	return c
}

// Of is the class of a call for service.
func (c *Classes) Of(service []byte) uint16 {
	if k, ok := c.byService[string(service)]; ok {
		return k
	}
	return c.dflt
}

// Record adds a call of class that arrived at arrived and was answered at
// now; the process that served it was free from since on (its last attach
// or completion), so its service began at the later of the two.
func (c *Classes) Record(class uint16, arrived, since, now time.Time) {
	if int(class) >= len(c.cur) {
		return // no policy, or classified under a policy replaced since
	}
	started := arrived
	if since.After(arrived) {
		started = since
	}
	c.cur[class].Record(now.Sub(arrived), started.Sub(arrived), c.goals[class])
}

// Len is the number of classes (0 with NoClasses).
func (c *Classes) Len() int { return len(c.cur) }

// Take returns the interval's figures by class and begins a new interval.
func (c *Classes) Take() []Sample {
	out := slices.Clone(c.cur)
	clear(c.cur)
	return out
}
