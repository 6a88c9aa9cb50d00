package def

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"time"
)

// This file is the service policy definition (svcpolicy): tpsched's
// counterpart of the workload manager's service definition (004), in
// OpenTP1's syntax. It names the service classes (a response-time goal and
// an importance), the rules that classify calls into them, the default
// class, the application environments (service groups the cluster starts
// on demand) and the interval at which goals are judged:
//
//	set policy_interval = 10
//	set default_class = BATCH
//	class -n ONLINE -i 1 -t 200 -p 90      # 90% of calls within 200 ms
//	class -n BATCH -i 3 -t 5000            # an average of 5 s
//	classify -g orders -s "add*" -c ONLINE
//	classify -g "report*" -c BATCH
//	environment -g orders
//	instance -n east                       # optional: subsystem instances
//	instance -n west
//
// The file is optional: without it the node manages no goals and starts
// no server on demand. Every node of a cluster should have the same one.
//
// With instances (004: "more than one instance of a subsystem ... the
// same application environments, but different subsystem names") every
// application environment is served per instance: instance east's
// servers of orders are the service group orders@east, defined by
// orders' usr file (scd/wlmnode's ExpandInstances makes the node's
// servers of them), with a high-water mark, placement and quiesce of
// their own.

// FilePolicy is the service policy definition, as OperandDoc.File names it.
const FilePolicy = "svcpolicy"

// Policy is the service policy definition (svcpolicy).
type Policy struct {
	File         string         // where it was read, for messages
	Interval     time.Duration  // policy_interval (seconds, 1..3600): how often each class's performance index is judged; default 10 s
	DefaultClass string         // default_class (required): the class of calls no rule classifies
	Classes      []ServiceClass // the class command, in the order given
	Rules        []ClassRule    // the classify command, in the order given: the first that matches classifies
	Environments []string       // the environment command: service groups started on demand, in the order given
	// Instances is the instance command: the subsystem instances (004), in
	// the order given; none: one, unnamed (the environments' own groups).
	Instances []string
	// Manage is goal_management: Y (default) acts on missed goals (CPU
	// weights, one more server, steering); N only measures and reports.
	Manage bool
}

// ServiceClass is one service class: class -n NAME -i IMPORTANCE -t MS [-p PERCENT].
type ServiceClass struct {
	Name         string
	Importance   int           // 1 (most) .. 5
	ResponseTime time.Duration // the goal's response time
	Percent      int           // 1..99: a percentile goal (Percent of calls within ResponseTime); 0: an average goal
}

// ClassRule is one classification rule: classify [-g GROUP] [-s SERVICE] -c CLASS.
type ClassRule struct {
	Group   string // a pattern ('*', '?', '[...]'); "" every group
	Service string // a pattern; "" every service
	Class   string
}

// Policy limits.
const (
	DefaultPolicyInterval = 10 * time.Second
	maxGoalMillis         = 3600000
	maxPolicyEntries      = 1024 // classes, rules or environments in one file
)

func defaultPolicy() Policy { return Policy{Interval: DefaultPolicyInterval, Manage: true} }

var policyOperands = map[string]operand[Policy]{
	"policy_interval": {
		set: func(p *Policy, v []string) (err error) {
			p.Interval, err = secondsIn(v, 1, 3600)
			return err
		},
		value:  "10",
		values: "1..3600 (seconds)",
		opentp1: "The workload manager judges each service class's goal against its actual response times and acts when a goal is " +
			"missed (004).",
		tpsched: "How often each class's performance index is computed and acted on: CPU weights, one more server, routing. " +
			"Indexes are judged over the last three intervals. Every node announces its spare CPU at this interval.",
		own: true,
	},
	"goal_management": {
		set: func(p *Policy, v []string) (err error) {
			p.Manage, err = boolYN(v)
			return err
		},
		value:   "Y",
		values:  "Y or N",
		opentp1: "The workload manager manages work to its goals; without goal management a system runs its work by its own fixed rules (004).",
		tpsched: "Y: a missed goal moves CPU weight, starts one more server of an application environment elsewhere, and steers calls to the nodes " +
			"that meet it. N: classes, performance indexes and reports as with Y, application environments still start on demand and " +
			"keep their high-water mark, but nothing is done about a missed goal: the node schedules by OpenTP1's rules alone " +
			"(for comparing the two, and for watching a policy before it acts).",
		own: true,
	},
	"default_class": {
		set: func(p *Policy, v []string) (err error) {
			if p.DefaultClass, err = one(v); err != nil {
				return err
			}
			return checkIdent("class", p.DefaultClass)
		},
		dflt:    "none: required",
		values:  "the name of a class of this file",
		opentp1: "Work that no classification rule assigns goes to a default service class (004).",
		tpsched: "The class of every call that no classify rule matches.",
		own:     true,
	},
}

var policyCommands = map[string]command[Policy]{
	"class": {
		set: func(p *Policy, flags map[string]string) error {
			c := ServiceClass{Name: flags["n"]}
			if _, ok := flags["n"]; !ok {
				return errors.New("-n NAME is required")
			}
			if err := checkIdent("class", c.Name); err != nil {
				return fmt.Errorf("-n: %w", err)
			}
			for _, o := range p.Classes {
				if o.Name == c.Name {
					return fmt.Errorf("class %s defined twice", shown(c.Name))
				}
			}
			var err error
			v, ok := flags["i"]
			if !ok {
				return errors.New("-i IMPORTANCE is required (1 most important .. 5)")
			}
			if c.Importance, err = parseUint(v, 1, 5); err != nil {
				return fmt.Errorf("-i: %w", err)
			}
			if v, ok = flags["t"]; !ok {
				return errors.New("-t MILLISECONDS is required (the goal's response time)")
			}
			ms, err := parseUint(v, 1, maxGoalMillis)
			if err != nil {
				return fmt.Errorf("-t: %w", err)
			}
			c.ResponseTime = time.Duration(ms) * time.Millisecond
			if v, ok = flags["p"]; ok {
				if c.Percent, err = parseUint(v, 1, 99); err != nil {
					return fmt.Errorf("-p: %w", err)
				}
			}
			if len(p.Classes) >= maxPolicyEntries {
				return fmt.Errorf("more than %d classes", maxPolicyEntries)
			}
			p.Classes = append(p.Classes, c)
			return nil
		},
		synopsis: "class -n NAME -i IMPORTANCE -t MILLISECONDS -p PERCENT",
		dflt:     "none: at least one is required",
		values: "once per class: -n a name of 1..31 bytes of letters, digits, '_', '-' and '.'; -i 1 (most important) .. 5; " +
			"-t 1..3600000 (ms); -p 1..99 (optional: without it the goal is an average)",
		opentp1: "A service class has a goal (an average response time, or a percentile of calls within a response time) and an " +
			"importance; the workload manager manages each request to its class's goal (004).",
		tpsched: "With -p the goal is PERCENT of the calls within MILLISECONDS (performance index: the bucket of the response-time " +
			"distribution where PERCENT is reached, as a fraction of the goal); without it, an average of MILLISECONDS (index: the average " +
			"over the goal). Calls are timed from their arrival at the serving node to their answer.",
	},
	"classify": {
		set: func(p *Policy, flags map[string]string) error {
			r := ClassRule{Group: flags["g"], Service: flags["s"], Class: flags["c"]}
			if _, ok := flags["c"]; !ok {
				return errors.New("-c CLASS is required")
			}
			if err := checkIdent("class", r.Class); err != nil {
				return fmt.Errorf("-c: %w", err)
			}
			for _, pat := range []struct{ opt, v string }{{"g", r.Group}, {"s", r.Service}} {
				if v, given := flags[pat.opt]; given && v == "" {
					// An empty pattern is read as the option left out: a
					// rule for no group (an empty variable in a template)
					// would classify every call.
					return fmt.Errorf("-%s: empty pattern (leave -%s out to match every one, or write \"*\")", pat.opt, pat.opt)
				}
				if _, err := path.Match(pat.v, ""); err != nil || len(pat.v) > maxNameLen {
					return fmt.Errorf("-%s: %q is not a pattern (letters, digits, '*', '?', [...])", pat.opt, shown(pat.v))
				}
			}
			if len(p.Rules) >= maxPolicyEntries {
				return fmt.Errorf("more than %d rules", maxPolicyEntries)
			}
			p.Rules = append(p.Rules, r)
			return nil
		},
		synopsis: "classify -g GROUP -s SERVICE -c CLASS",
		dflt:     "none: every call is of default_class",
		values: "any number: -g and -s patterns ('*' any characters, '?' one, [...] a set; each optional, meaning every group " +
			"or service; not empty), -c a class of this file",
		opentp1: "Classification rules assign incoming work to a service class by its attributes (004).",
		tpsched: "A call is of the class of the first rule, in the order written, whose patterns match its service group and service. " +
			"Quote a pattern with '*' at its start.",
	},
	"environment": {
		set: func(p *Policy, flags map[string]string) (err error) {
			p.Environments, err = appendName(p.Environments, flags, "g", "GROUP", "service group", "environment", maxPolicyEntries)
			return err
		},
		synopsis: "environment -g GROUP",
		dflt:     "none: every user server starts with its node",
		values:   "once per service group: -g a service group name",
		opentp1: "An application environment is a set of servers the workload manager starts when work for it comes and no " +
			"server is there: at most one per system, the first on the system with the most capacity at the work's importance, " +
			"more on other systems when the goal is missed; it never stops them for lack of work (004).",
		tpsched: "The service group becomes an application environment: a node whose usr files define it starts no process for it " +
			"until the cluster chooses that node to serve it (find server, a call, or a missed goal). Each node has at most one server " +
			"of it (the user server with its parallel_count, at least one resident process). Dropping it from the policy quiesces its servers.",
	},
	"instance": {
		set: func(p *Policy, flags map[string]string) (err error) {
			p.Instances, err = appendName(p.Instances, flags, "n", "NAME", "instance", "instance", maxInstances)
			return err
		},
		synopsis: "instance -n NAME",
		dflt:     "none: one routing manager, whose servers of an environment are the environment's own service group",
		values:   "once per instance, at most 64: -n a name of 1..31 bytes of letters, digits, '_', '-' and '.'; needs an environment command",
		opentp1: "More than one instance of a subsystem may run in the sysplex: the same subsystem type, and therefore the same application " +
			"environments, but different subsystem names. The rules for starting servers apply to each instance separately: for each " +
			"instance, up to one server per system per application environment (004).",
		tpsched: "Every application environment is served per instance: instance NAME's servers of environment E are the service group " +
			"E@NAME, defined by E's usr file (its module, services and parallel_count) but with a schedule queue, processes and a user of " +
			"their own, so a node may run one server of E for each instance. Each instance's servers are placed, counted (high-water mark), " +
			"quiesced and refreshed apart; calls, finds and scdctl name the instance (E@NAME); a call or find for E itself is refused, " +
			"naming the instances, and scdctl quiesce, resume, refresh and prc with E act on every instance. classify -g E covers every " +
			"instance, -g E@NAME one. The instances are fixed at start: scdctl policy refuses a file whose instances differ.",
	},
}

// maxInstances bounds the instance command: each is a server of every
// application environment on each node that is chosen for it.
const maxInstances = 64

// LoadPolicy reads dir/svcpolicy; nil, nil when there is none. scdd reads
// it at start and again on `scdctl policy`.
func LoadPolicy(dir string) (*Policy, error) {
	if dir == "" {
		return nil, nil
	}
	return loadPolicy(os.DirFS(dir))
}

func loadPolicy(fsys fs.FS) (*Policy, error) {
	if there, err := statFile(fsys, FilePolicy); !there {
		return nil, err
	}
	var errs collector
	stmts, lines, err := readOptional(fsys, FilePolicy)
	errs.add(err)
	p := defaultPolicy()
	p.File = FilePolicy
	given, err := apply(FilePolicy, stmts, policyOperands, policyCommands, &p, nil)
	errs.add(err)
	end := max(lines, 1)
	if len(p.Classes) == 0 {
		errs.add(&Error{File: FilePolicy, Line: end, Operand: "class", Reason: "at least one service class is required (class -n NAME -i IMPORTANCE -t MILLISECONDS)"})
		return nil, errs.err()
	}
	known := func(name string) error {
		var names []string
		for _, c := range p.Classes {
			if c.Name == name {
				return nil
			}
			names = append(names, c.Name)
		}
		why := fmt.Sprintf("class %q is not defined in this file", shown(name))
		if s := Suggest(name, names); s != "" {
			why += " (did you mean " + s + "?)"
		}
		return errors.New(why)
	}
	if _, ok := given["default_class"]; !ok {
		errs.add(&Error{File: FilePolicy, Line: end, Operand: "default_class", Reason: "required: the class of calls no classify rule matches"})
	} else if err := known(p.DefaultClass); err != nil {
		errs.add(&Error{File: FilePolicy, Line: given["default_class"], Operand: "default_class", Reason: err.Error()})
	}
	for _, st := range stmts {
		if c, ok := flagValue(st, "c"); ok && st.Kind == StmtCommand && st.Name == "classify" && checkIdent("class", c) == nil {
			// A malformed name was refused above; a long one would take
			// known's did-you-mean a while.
			if err := known(c); err != nil {
				errs.add(&Error{File: FilePolicy, Line: st.Line, Operand: "classify", Reason: "-c: " + err.Error()})
			}
		}
	}
	if len(p.Instances) > 0 && len(p.Environments) == 0 {
		errs.add(&Error{File: FilePolicy, Line: given["instance command"], Operand: "instance",
			Reason: "no application environment for the instances to serve (environment -g GROUP)"})
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return &p, nil
}

// flagValue is the value of the command's option name.
func flagValue(st Stmt, name string) (string, bool) {
	for _, f := range st.Flags {
		if f.Name == name {
			return f.Value, true
		}
	}
	return "", false
}

// appendName appends to names the value of -flag (meta in the synopsis),
// an identifier of kind ident, refusing it when missing, malformed, named
// twice, or past max names: an environment's -g and an instance's -n.
func appendName(names []string, flags map[string]string, flag, meta, ident, noun string, max int) ([]string, error) {
	v, ok := flags[flag]
	if !ok {
		return names, fmt.Errorf("-%s %s is required", flag, meta)
	}
	if err := checkIdent(ident, v); err != nil {
		return names, fmt.Errorf("-%s: %w", flag, err)
	}
	if slices.Contains(names, v) {
		return names, fmt.Errorf("%s %s named twice", noun, shown(v))
	}
	if len(names) >= max {
		return names, fmt.Errorf("more than %d %ss", max, noun)
	}
	return append(names, v), nil
}
