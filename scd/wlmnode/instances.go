package wlmnode

// This file is subsystem instances (004): "more than one instance of a
// subsystem ... the same subsystem type, and therefore the same
// application environments, but different subsystem names"; "for each
// instance, you can have up to one server per system per application
// environment". With svcpolicy's instance commands every application
// environment is served per instance, as the service group ENV@INSTANCE
// (wlm.InstanceGroup): its own schedule queue, processes and user, so a
// node may run one server of an environment for each instance, and the
// routing manager, which counts, places, quiesces and refreshes per
// group of wlm.Policy.Environments, does so per instance.

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"tpsched/netio"
	"tpsched/scd/def"
	"tpsched/scd/wlm"
)

// ExpandInstances returns servers with each user server of an application
// environment of p replaced, when p has instances, by one copy per
// instance: named and grouped ENV@INSTANCE (its usr file's name and its
// service group each get "@INSTANCE"), everything else as defined. The
// result is sorted by name, as def.Load sorts servers. Without instances
// (or without p) it returns servers as they are. The node calls it before
// it makes its groups.
func ExpandInstances(servers []def.Server, p *def.Policy) []def.Server {
	if p == nil || len(p.Instances) == 0 {
		return servers
	}
	out := make([]def.Server, 0, len(servers)+len(p.Environments)*len(p.Instances))
	for _, s := range servers {
		if !slices.Contains(p.Environments, s.ServiceGroup) {
			out = append(out, s)
			continue
		}
		for _, in := range p.Instances {
			c := s
			c.Name = wlm.InstanceGroup(s.Name, in)
			c.ServiceGroup = wlm.InstanceGroup(s.ServiceGroup, in)
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// InstanceGroups are the groups of env's instances (orders: orders@east,
// orders@west) when the policy in force has instances and names env;
// else nil (scdctl prc ENV lists them all).
func (w *Manager) InstanceGroups(env string) []string {
	return w.policy.Load().p.InstanceGroups(env)
}

// perInstance is the refusal of a call or find for an environment that
// is served per instance, naming them; "" for any other group.
func (m *envs) perInstance(group string) string {
	groups := m.policy().InstanceGroups(group)
	if groups == nil {
		return ""
	}
	return fmt.Sprintf("application environment %s is served per instance: name one (%s)", group, strings.Join(groups, ", "))
}

// envKeys are the groups an action on env covers under policy p: env,
// when it is a group started on demand (an environment, or one instance's
// group of one), else every instance's group of env.
func envKeys(p *wlm.Policy, env string) ([]string, error) {
	if p.IsEnvironment(env) {
		return []string{env}, nil
	}
	if groups := p.InstanceGroups(env); groups != nil {
		return groups, nil
	}
	name := env
	if s := def.Suggest(env, p.Environments); s != "" {
		name += " (did you mean " + s + "?)"
	}
	return nil, &netio.Error{Code: netio.CodeNoSuchGroup, Message: name + " is not an application environment of the policy"}
}

// checkInstances refuses a policy read again whose instances are not the
// ones in force, or that makes an environment of a group this node
// started as a plain server while there are instances: a node makes the
// groups of the instances once, at start. local is the node's groups.
func checkInstances(local Local, old, p *wlm.Policy) error {
	if !slices.Equal(old.Instances, p.Instances) {
		return fmt.Errorf("%s: instance: the instances are %v, the node runs %v: a node makes the instances' servers at start, so restart it to change them",
			def.FilePolicy, p.Instances, old.Instances)
	}
	var errs []error
	for _, env := range p.Environments {
		if old.IsEnvironment(env) {
			continue
		}
		named, _ := wlm.SplitInstance(env)
		if _, ok := local.Group(env); !ok {
			if _, plain := local.Group(named); plain {
				errs = append(errs, fmt.Errorf("%s: environment %s: this node started it as a plain server, not one per instance: restart the node to serve it per instance",
					def.FilePolicy, named))
			}
		}
	}
	return errors.Join(slices.CompactFunc(errs, func(a, b error) bool { return a.Error() == b.Error() })...)
}
