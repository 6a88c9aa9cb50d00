package names

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// This file is the routing manager's part of an announce (source document
// 004), sent by a node with a service policy (svcpolicy) and flagged in
// the header (flags bit 1), so that a node without one sends what it
// always sent. After the groups:
//
//	count times (the groups' count): uvarint pi   performance index x 100, 0 unknown
//	5 times:                          uvarint spare thousandths of a CPU available to
//	                                                work of importance 1..5
//	uvarint count                     application environments this node can serve
//	count times:
//	string  env      service group name, strictly increasing
//	1       state    bit 0: quiesced; other bits 0
//	uvarint epoch    of the quiesce/resume that set the state
//	uvarint hwm      high-water mark of the environment's servers

// Importances is how many importance levels spare CPU is announced for.
const Importances = 5

// maxPI bounds an announced performance index x 100 (PI 655.35).
const maxPI = 1<<16 - 1

// WLMInfo is what a node with a service policy announces.
type WLMInfo struct {
	// Spare is the CPU available to work of importance 1..5 (index 0..4),
	// in thousandths of a CPU.
	Spare [Importances]uint32
	// Envs are the application environments this node defines (it has
	// their module), served here or not, with what it knows of each;
	// sorted by Env.
	Envs []EnvInfo
}

// EnvInfo is one application environment as a node announces it.
type EnvInfo struct {
	Env      string
	Epoch    uint32
	HWM      uint32
	Quiesced bool
}

func (w *WLMInfo) equal(o *WLMInfo) bool {
	if w == nil || o == nil {
		return w == o
	}
	return w.Spare == o.Spare && slices.Equal(w.Envs, o.Envs)
}

func (w *WLMInfo) clone() *WLMInfo {
	if w == nil {
		return nil
	}
	c := *w
	c.Envs = slices.Clone(w.Envs)
	return &c
}

func (w *WLMInfo) validate(node string) error {
	if w == nil {
		return nil
	}
	if len(w.Envs) > maxGroups {
		return fmt.Errorf("node %q: %d application environments (at most %d)", node, len(w.Envs), maxGroups)
	}
	for i, e := range w.Envs {
		switch {
		case e.Env == "":
			return fmt.Errorf("node %q: application environment %d has an empty name", node, i)
		case len(e.Env) > maxNameLen:
			return fmt.Errorf("node %q: application environment name %.20q... is %d bytes (at most %d)", node, e.Env, len(e.Env), maxNameLen)
		case i > 0 && e.Env <= w.Envs[i-1].Env:
			return fmt.Errorf("node %q: application environment %q after %q (sorted by name, each once)", node, e.Env, w.Envs[i-1].Env)
		}
	}
	return nil
}

func appendWLM(dst []byte, info *NodeInfo) []byte {
	for _, g := range info.Groups {
		dst = binary.AppendUvarint(dst, uint64(g.PI))
	}
	for _, s := range info.WLM.Spare {
		dst = binary.AppendUvarint(dst, uint64(s))
	}
	dst = binary.AppendUvarint(dst, uint64(len(info.WLM.Envs)))
	for _, e := range info.WLM.Envs {
		dst = appendString(dst, e.Env)
		var state byte
		if e.Quiesced {
			state = 1
		}
		dst = append(dst, state)
		dst = binary.AppendUvarint(dst, uint64(e.Epoch))
		dst = binary.AppendUvarint(dst, uint64(e.HWM))
	}
	return dst
}

// readWLM reads the routing manager's part; groups get their PIs.
func readWLM(r *reader, groups []GroupInfo) *WLMInfo {
	w := &WLMInfo{}
	for i := range groups {
		pi := r.readUvarint("performance index")
		if pi > maxPI {
			r.fail("performance index", "%d (at most %d)", pi, maxPI)
		}
		groups[i].PI = uint16(pi)
	}
	for i := range w.Spare {
		s := r.readUvarint("spare CPU")
		if s > 1<<32-1 {
			r.fail("spare CPU", "%d thousandths overflow 32 bits", s)
		}
		w.Spare[i] = uint32(s)
	}
	n := r.readUvarint("environment count")
	switch left := uint64(len(r.s) - r.off); {
	case r.err != nil:
		return nil
	case n > maxGroups:
		r.fail("environment count", "%d application environments (at most %d)", n, maxGroups)
	case n > left/4: // a name length, a byte of name, the state, epoch and hwm
		r.fail("environment count", "%d application environments cannot fit in %d bytes", n, left)
	case n > 0:
		w.Envs = make([]EnvInfo, n)
	}
	for i := range w.Envs {
		if r.err != nil {
			break
		}
		e := &w.Envs[i]
		e.Env = r.readString("application environment name")
		state := r.readByte("application environment state")
		if state&^1 != 0 {
			r.fail("application environment state", "unknown bits %#x", state)
		}
		e.Quiesced = state&1 != 0
		epoch, hwm := r.readUvarint("epoch"), r.readUvarint("high-water mark")
		if epoch > 1<<32-1 || hwm > 1<<32-1 {
			r.fail("high-water mark", "epoch %d, mark %d overflow 32 bits", epoch, hwm)
		}
		e.Epoch, e.HWM = uint32(epoch), uint32(hwm)
	}
	return w
}
