// Command greet-client is an example of calling tpsched services from Go
// with tpsched/scd/client, the TP1/Client counterpart. It calls the
// example UAP's services (examples/uap-go) and shows how failures look.
//
//	cd examples/client-go
//	go run . -c betranrc world     # betranrc names the node (dchost)
//	DCHOST=127.0.0.1:12100 go run . world
//
// The client environment definition is betranrc (-c, OpenTP1's syntax) and
// the DC* environment variables, which win over it: dchost, dchostselect,
// dcscdhostchange, dccltloadbalance, dccache, dccltcachetim, watch_time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"tpsched/netio"
	"tpsched/scd/client"
	"tpsched/scd/def"
)

func main() {
	log.SetPrefix("greet-client: ")
	log.SetFlags(0)
	conf := flag.String("c", "", "client environment definition (betranrc); DC* variables win over it")
	node := flag.String("node", "", "call this node only (host:port): an explicit destination")
	flag.Parse()
	name := strings.Join(flag.Args(), " ")
	if name == "" {
		name = "world"
	}
	if err := run(*conf, *node, name); err != nil {
		log.Fatal(err)
	}
}

func run(conf, node, name string) error {
	cc, err := def.LoadClient(conf)
	if err != nil {
		return err
	}
	if len(cc.Hosts) == 0 {
		return errors.New("no node to call: set dchost in betranrc (-c) or DCHOST")
	}
	c, err := client.New(client.FromDefinition(cc))
	if err != nil {
		return err
	}
	// Close closes the client's connections (one per node it called, each
	// carrying many calls); calls still in flight fail 'network down'.
	defer c.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	call := func(service string, payload []byte) ([]byte, error) {
		if node != "" {
			return c.CallTo(ctx, node, "greet", service, payload) // that node only, never balanced
		}
		return c.Call(ctx, "greet", service, payload)
	}

	for _, service := range []string{"hello", "upper", "count"} {
		reply, err := call(service, []byte(name))
		if err != nil {
			return fmt.Errorf("%s: %w", service, err)
		}
		fmt.Printf("%s: %s\n", service, reply)
	}

	// Failures are *netio.Error values with an OpenTP1-style code.
	var te *netio.Error
	_, err = call("fail", []byte(name))
	if !errors.As(err, &te) || te.Code != netio.CodeApplication {
		return fmt.Errorf("fail: %v, want an application error", err)
	}
	fmt.Printf("fail: %s: %s\n", te.Code, te.Message)
	_, err = call("nosuch", nil)
	if !errors.As(err, &te) || te.Code != netio.CodeNoSuchService {
		return fmt.Errorf("nosuch: %v, want 'no such service'", err)
	}
	fmt.Printf("nosuch: %s: %s\n", te.Code, te.Message)
	return nil
}
