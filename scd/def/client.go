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
func LoadClient(path string) (*Client, error) {
	c := defaultClient()
	if path != "" {
		src, err := os.ReadFile(path)
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
			canon := st.Name
			if a, ok := clientAliases[canon]; ok {
				canon = a
			}
			if first, ok := given[canon]; ok && st.Kind == StmtSet {
				return nil, &Error{File: path, Line: st.Line, Operand: st.Name,
					Reason: fmt.Sprintf("already set as %s at line %d", first.Name, first.Line)}
			}
			given[canon] = st
		}
		if _, err := apply(path, stmts, table, &c, nil); err != nil {
			return nil, err
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
	}
	return &c, nil
}
