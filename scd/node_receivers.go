package scd

import (
	"errors"
	"net"
	"strconv"

	"tpsched/bpf"
	"tpsched/netio/rpcport"
	"tpsched/scd/def"
)

// This file gives the RPC port the node's receiver groups (scdsvcdef's
// scdmulti -g NAME -m COUNT -p PORT) and the program that steers their
// connections; which group takes which call is scd/cluster's Receivers.

// Steering choices (Options.Steering).
const (
	SteeringOff = "off" // the kernel's hash places every group's connections
)

// receiverGroups are the named receiver groups for netio.
func receiverGroups(cfg *def.Config) []rpcport.ReceiverGroup {
	var out []rpcport.ReceiverGroup
	for _, rg := range cfg.Sched.ReceiverGroups {
		out = append(out, rpcport.ReceiverGroup{Name: rg.Name, Count: rg.Count,
			Addr: net.JoinHostPort(cfg.System.RPCAddress, strconv.Itoa(rg.Port))})
	}
	return out
}

// steerer places each receiver group's new connections: the SK_REUSEPORT
// program of package bpf, unless Options.Steering turns it off.
type steerer struct{ off bool }

func (s steerer) Steer(_ string, fds []int) (rpcport.Steered, error) {
	if s.off {
		return nil, errors.New("turned off (scdd -steering off, or TPSCHED_STEERING=off)")
	}
	st, err := bpf.Steer(fds)
	if err != nil {
		return nil, err
	}
	return st, nil
}
