package def

import (
	"fmt"
	"os"
	"sort"
	"strings"
)

// LoadClient reads the client environment definition: the betranrc file at
// path (none when path is ""), then every environment variable named like
// an operand in upper case (DCHOST, DCSCDDIRECT, DCHOSTSELECT,
// DCSCDHOSTCHANGE, DCCLTLOADBALANCE, DCCACHE, DCCLTCACHETIM, DCNAMUSE,
// DCWATCHTIM, DCMAXMSGSIZE), which wins over the file. An empty variable
// counts as unset. Lists in a variable are comma-separated:
// DCHOST=host1:12000,host2.
//
// betranrc uses the server files' syntax with the operands in lower case
// (set dchost = host1:12000,host2); watch_time and max_message_size are
// accepted there for dcwatchtim and dcmaxmsgsize. Without any dchost the
// host list is empty: the caller picks its own fallback.
//
// dcnamuse has no field: the Go client asks the name service exactly when
// it balances, so it is only checked against dccltloadbalance (see
// checkClientModes).
//
// betranrc must be a regular file of at most 16 MiB, as a definition file:
// a named pipe or a device is refused, not read.
func LoadClient(path string) (*Client, error) {
	c := defaultClient()
	modes := map[string]modeGiven{}
	if path != "" {
		src, err := readOS(path)
		if err != nil {
			return nil, fmt.Errorf("client definition: %w", err)
		}
		stmts, err := Parse(path, src)
		if err != nil {
			return nil, err
		}
		table := make(map[string]operand[Client], len(clientOperands)+len(clientAliases))
		for name, op := range clientOperands {
			table[name] = op
		}
		for alias, name := range clientAliases {
			table[alias] = clientOperands[name]
		}
		given := map[string]Stmt{}
		for _, st := range stmts {
			if st.Kind != StmtSet { // a putenv or a command: apply refuses it
				continue
			}
			canon := st.Name
			if a, ok := clientAliases[canon]; ok {
				canon = a
			}
			if first, ok := given[canon]; ok {
				return nil, &Error{File: path, Line: st.Line, Operand: st.Name,
					Reason: fmt.Sprintf("already set as %s at line %d", first.Name, first.Line)}
			}
			given[canon] = st
		}
		if _, err := apply(path, stmts, table, nil, &c, nil); err != nil {
			return nil, err
		}
		for _, st := range stmts {
			if st.Kind == StmtSet && clientModeOperand[st.Name] {
				modes[st.Name] = modeGiven{yes: strings.EqualFold(st.Values[0], "Y"),
					at: Error{File: path, Line: st.Line, Operand: st.Name}}
			}
		}
	}
	names := make([]string, 0, len(clientOperands))
	for op := range clientOperands {
		names = append(names, op)
	}
	sort.Strings(names)
	for _, op := range names {
		env := strings.ToUpper(op)
		v := os.Getenv(env)
		if v == "" {
			continue
		}
		var vals []string
		for _, f := range strings.Split(v, ",") {
			vals = append(vals, strings.TrimSpace(f))
		}
		if err := clientOperands[op].set(&c, vals); err != nil {
			return nil, &Error{File: "environment", Operand: env, Reason: err.Error()}
		}
		if clientModeOperand[op] {
			modes[op] = modeGiven{yes: strings.EqualFold(vals[0], "Y"), at: Error{File: "environment", Operand: env}}
		}
	}
	if err := checkClientModes(&c, modes); err != nil {
		return nil, err
	}
	return &c, nil
}

// clientModeOperand are the operands that choose how a client finds its
// scheduler; checkClientModes checks them against each other.
var clientModeOperand = map[string]bool{"dcnamuse": true, "dccltloadbalance": true}

// modeGiven is the final value of a clientModeOperand, and where it came
// from.
type modeGiven struct {
	yes bool
	at  Error // File, Line, Operand
}

func (m modeGiven) where() string {
	if m.at.Line > 0 {
		return fmt.Sprintf("%s:%d", m.at.File, m.at.Line)
	}
	return "environment " + m.at.Operand
}

func (m modeGiven) fail(format string, args ...any) error {
	e := m.at
	e.Reason = fmt.Sprintf(format, args...)
	return &e
}

// checkClientModes refuses what the Go client cannot do. It asks a node's
// name service exactly when it balances (dccltloadbalance), so dcnamuse
// (use the name service) must agree with it. dcscddirect goes with either:
// it says how a node balances the calls sent to a dchost node.
func checkClientModes(c *Client, modes map[string]modeGiven) error {
	lb := "dccltloadbalance = N (its default)"
	if m, ok := modes["dccltloadbalance"]; ok {
		lb = fmt.Sprintf("dccltloadbalance = %s (%s)", map[bool]string{true: "Y", false: "N"}[m.yes], m.where())
	}
	if m, ok := modes["dcnamuse"]; ok && m.yes != c.LoadBalance {
		if m.yes {
			return m.fail("Y is not supported with %s: tpsched's client asks the name service only to balance; "+
				"set dccltloadbalance = Y or remove dcnamuse", lb)
		}
		return m.fail("N contradicts %s, which asks the name service (client-side balancing needs dcnamuse = Y); set Y or remove dcnamuse", lb)
	}
	return nil
}
