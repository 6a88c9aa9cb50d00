// Package wlm owns the decisions of tpsched's goal-driven routing manager,
// after the workload manager's routing-manager model (source document 004):
// service classes with a response-time goal and an importance, the
// classification of calls into classes, the performance index of a class
// (actual over goal), the response-time distribution at fractions and
// multiples of the goal, a node's spare CPU by importance, where the first
// server of an application environment goes, what to do when a class
// misses its goal, which nodes a class's calls are steered to, and the
// high-water mark of an environment's servers.
//
// It is pure logic: no I/O, no clock, no goroutines, no logging. The caller
// (scd) measures, announces, starts and stops servers, and hands this
// package what it measured; the decisions come back as values.
//
// # Terms
//
// A service class has a goal, either an average response time ("average
// 150ms") or a percentile ("90% within 200ms"), and an importance from 1
// (most) to 5 (least). A call is classified by its service group and
// service: the first rule whose patterns match (path.Match wildcards: '*',
// '?', '[...]') gives its class, else the policy's default class.
//
// The performance index (PI) of a class over some calls is actual over
// goal: the average response time over the goal's for an average goal; for
// a percentile goal, the bound of the distribution bucket in which the
// goal's percentile of the calls is reached, as a fraction of the goal (90%
// of the calls within 120% of the goal: PI 1.2). PI <= 1 meets the goal.
// Beyond the last bucket (400% of the goal) PI is PIBeyond.
//
// An application environment is a service group started on demand. With
// subsystem instances (004: the same application environments under other
// subsystem names) each environment is served per instance, as the group
// InstanceGroup(env, instance), "orders@east"; everything counted per
// environment (servers, the high-water mark, quiesce) is counted per
// such group, so each instance has its own.
//
// # Managing to goals
//
// Decide takes the classes' PIs and the node's service groups and picks the
// most important class that misses its goal (the receiver). In the order of
// document 004's issue: its groups on this node get more CPU weight and the
// groups serving only less important classes less (cgroup weights are
// work-conserving: a donor loses CPU only while the receiver wants it),
// unless its processes do not wait for a CPU (then weight cannot help);
// when the weights are at their bounds, an application environment among
// its groups is to grow by one server on another node. Steer keeps a
// class's calls off the nodes where it misses while others meet it. The
// high-water mark (EnvState) never falls except by quiesce or a new policy.
//
// # Usage
//
//	p, err := wlm.NewPolicy(classes, "BATCH", rules, envs, instances, 10*time.Second)
//	c := p.Classify("orders", "add")            // index into p.Classes
//	var s wlm.Sample
//	s.Record(resp, queue, p.Classes[c].Goal)     // per call
//	pi, ok := wlm.PI(p.Classes[c].Goal, s)       // per interval
//	d := wlm.Decide(classes, groups, wlm.DefaultLimits)
package wlm

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Importance bounds: 1 is the most important.
const (
	MostImportant  = 1
	LeastImportant = 5
)

// GoalKind says how a goal is stated.
type GoalKind uint8

const (
	// GoalAverage: the average response time at most Target.
	GoalAverage GoalKind = iota + 1
	// GoalPercentile: Percent of the calls within Target.
	GoalPercentile
)

// Goal is a response-time goal.
type Goal struct {
	Kind    GoalKind
	Target  time.Duration
	Percent int // GoalPercentile: 1..99
}

func (g Goal) String() string {
	if g.Kind == GoalPercentile {
		return strconv.Itoa(g.Percent) + "% within " + g.Target.String()
	}
	return "average " + g.Target.String()
}

func (g Goal) check() error {
	switch {
	case g.Target <= 0:
		return fmt.Errorf("response time %v: want more than 0", g.Target)
	case g.Kind == GoalAverage:
		return nil
	case g.Kind != GoalPercentile:
		return fmt.Errorf("goal kind %d", g.Kind)
	case g.Percent < 1 || g.Percent > 99:
		return fmt.Errorf("percentile %d: want 1..99", g.Percent)
	}
	return nil
}

// Class is a service class.
type Class struct {
	Name       string
	Importance int // MostImportant..LeastImportant
	Goal       Goal
}

// Rule classifies the calls whose group and service match its patterns.
type Rule struct {
	Group   string // pattern; "" matches every group
	Service string // pattern; "" matches every service
	Class   string
}

type rule struct {
	group, service string
	class          int
}

// Policy is a service policy: classes, classification rules, the default
// class, the application environments, the subsystem instances and the
// interval of the performance-index evaluation. It is not modified after
// NewPolicy.
type Policy struct {
	Classes []Class
	Default int // index into Classes
	// Environments are the service groups started on demand: each
	// application environment as named, or, with instances, each
	// environment's group of each instance (InstanceGroup), environments
	// in the order named and each one's instances in theirs. Everything
	// the routing manager counts per environment (servers, the high-water
	// mark, quiesce) it counts per group of this list.
	Environments []string
	// Instances are the subsystem instances (004: the same subsystem type,
	// so the same application environments, other subsystem names), in
	// the order named; none: one instance, unnamed.
	Instances []string
	Interval  time.Duration
	rules     []rule
	envs      map[string]bool
	named     map[string][]string // with instances: an environment as named -> its instances' groups
}

// InstanceSep joins an application environment and a subsystem instance
// into the name of the instance's service group: orders@east. Neither a
// service group nor an instance may hold it (their names are letters,
// digits, '_', '-' and '.'), so the name splits back one way only.
const InstanceSep = "@"

// InstanceGroup is the service group of instance's servers of environment
// env ("orders", "east": "orders@east"); env itself without an instance.
func InstanceGroup(env, instance string) string {
	if instance == "" {
		return env
	}
	return env + InstanceSep + instance
}

// SplitInstance is InstanceGroup's inverse: "orders@east" is "orders",
// "east"; a group without InstanceSep is itself and "".
func SplitInstance(group string) (env, instance string) {
	env, instance, _ = strings.Cut(group, InstanceSep)
	return env, instance
}

// NewPolicy checks and builds a policy. Errors name the class, rule,
// environment or instance at fault.
func NewPolicy(classes []Class, defaultClass string, rules []Rule, envs, instances []string, interval time.Duration) (*Policy, error) {
	if len(classes) == 0 {
		return nil, errors.New("no service class")
	}
	if interval <= 0 {
		return nil, fmt.Errorf("interval %v: want more than 0", interval)
	}
	p := &Policy{Classes: append([]Class(nil), classes...), Default: -1, Interval: interval, envs: map[string]bool{}}
	byName := map[string]int{}
	for i, c := range p.Classes {
		if c.Name == "" {
			return nil, fmt.Errorf("service class %d has no name", i+1)
		}
		if _, dup := byName[c.Name]; dup {
			return nil, fmt.Errorf("service class %s defined twice", c.Name)
		}
		if c.Importance < MostImportant || c.Importance > LeastImportant {
			return nil, fmt.Errorf("service class %s: importance %d: want %d..%d", c.Name, c.Importance, MostImportant, LeastImportant)
		}
		if err := c.Goal.check(); err != nil {
			return nil, fmt.Errorf("service class %s: %w", c.Name, err)
		}
		byName[c.Name] = i
	}
	d, ok := byName[defaultClass]
	if !ok {
		return nil, fmt.Errorf("default class %q is not a service class", defaultClass)
	}
	p.Default = d
	for i, r := range rules {
		c, ok := byName[r.Class]
		if !ok {
			return nil, fmt.Errorf("rule %d: class %q is not a service class", i+1, r.Class)
		}
		for _, pat := range []string{r.Group, r.Service} {
			if _, err := path.Match(pat, ""); err != nil {
				return nil, fmt.Errorf("rule %d: pattern %q: %w", i+1, pat, err)
			}
		}
		p.rules = append(p.rules, rule{group: r.Group, service: r.Service, class: c})
	}
	for _, in := range instances {
		switch {
		case in == "" || strings.Contains(in, InstanceSep):
			return nil, fmt.Errorf("instance %q: want a name without %q", in, InstanceSep)
		case slices.Contains(p.Instances, in):
			return nil, fmt.Errorf("instance %s named twice", in)
		}
		p.Instances = append(p.Instances, in)
	}
	if len(instances) > 0 {
		p.named = map[string][]string{}
	}
	for _, e := range envs {
		if e == "" || strings.Contains(e, InstanceSep) {
			return nil, fmt.Errorf("application environment %q: want a name without %q", e, InstanceSep)
		}
		if p.envs[e] || p.named[e] != nil {
			return nil, fmt.Errorf("application environment %s named twice", e)
		}
		if len(p.Instances) == 0 {
			p.envs[e] = true
			p.Environments = append(p.Environments, e)
			continue
		}
		for _, in := range p.Instances {
			g := InstanceGroup(e, in)
			p.envs[g] = true
			p.Environments = append(p.Environments, g)
			p.named[e] = append(p.named[e], g)
		}
	}
	return p, nil
}

// InstanceGroups are the groups of env's instances ("orders": orders@east,
// orders@west), when the policy has instances and names env; else nil.
func (p *Policy) InstanceGroups(env string) []string { return p.named[env] }

func match(pattern, name string) bool {
	if pattern == "" || pattern == "*" {
		return true
	}
	ok, _ := path.Match(pattern, name) // checked by NewPolicy
	return ok
}

// Classify returns the index of the class of a call to service of group:
// the first rule that matches both, else the default class. A group
// pattern matches an instance's group (orders@east) by its whole name or
// by its environment's (orders): the instances do the same work.
func (p *Policy) Classify(group, service string) int {
	env, _ := SplitInstance(group)
	for _, r := range p.rules {
		if (match(r.group, group) || env != group && match(r.group, env)) && match(r.service, service) {
			return r.class
		}
	}
	return p.Default
}

// ClassIndex returns the index of the class named name.
func (p *Policy) ClassIndex(name string) (int, bool) {
	for i, c := range p.Classes {
		if c.Name == name {
			return i, true
		}
	}
	return 0, false
}

// IsEnvironment reports whether group is an application environment of the
// policy: started on demand, on the node the cluster chooses.
func (p *Policy) IsEnvironment(group string) bool { return p.envs[group] }

// Importance is the importance at which work of group runs, for placement:
// the most important class any of services of group is classified to.
func (p *Policy) Importance(group string, services []string) int {
	imp := LeastImportant
	for _, s := range services {
		imp = min(imp, p.Classes[p.Classify(group, s)].Importance)
	}
	if len(services) == 0 {
		imp = p.Classes[p.Default].Importance
	}
	return imp
}
