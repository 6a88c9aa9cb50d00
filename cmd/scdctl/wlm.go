package main

// The routing manager's commands (source document 004): find server, the
// VARY WLM actions (quiesce, resume, refresh), reading svcpolicy again,
// and the workload activity report.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"tpsched/netio"
	"tpsched/scd"
	"tpsched/scd/client"
	"tpsched/scd/def"
)

// find asks the node where to send calls for an application environment,
// having one server started when none runs.
func find(ctx context.Context, nd node, args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return usageError("find ENV")
	}
	c, err := client.New(client.Options{Hosts: []string{nd.rpc}, MaxMessageSize: def.MaxMaxMessageSize})
	if err != nil {
		return err
	}
	defer c.Close()
	nodes, err := c.FindServer(ctx, args[0])
	if err != nil {
		var te *netio.Error
		if errors.As(err, &te) && te.Code == netio.CodeNetworkDown {
			return fmt.Errorf("%w (is scdd running at %s? %s)", err, nd.rpc, rpcHint)
		}
		return fmt.Errorf("find %s: %w", args[0], err)
	}
	for _, n := range nodes {
		fmt.Fprintf(stdout, "%s\tLEVEL%d\n", n.Addr, n.Level)
	}
	return nil
}

// envAction runs quiesce, resume or refresh of ENV, or policy, on every
// node of the cluster through the local node's control socket. It fails
// (exit 1) when any node reports an error, with -json too, so that a
// script sees it; text mode then says which nodes failed and which did it
// instead of the success headline.
func envAction(ctx context.Context, nd node, asJSON bool, verb string, args []string, stdout io.Writer) error {
	u := "http://scdd/" + verb
	if verb == "policy" {
		if len(args) != 0 {
			return usageError("policy")
		}
	} else {
		if len(args) != 1 {
			return usageError(verb + " ENV")
		}
		u += "?env=" + url.QueryEscape(args[0])
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, u, nd.where(), "")
	if err != nil {
		return err
	}
	if asJSON {
		if _, err := stdout.Write(body); err != nil {
			return err
		}
	}
	var res scd.EnvActionResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("%s: answer from %s: %w", verb, nd.sock, err)
	}
	perInstance := slices.ContainsFunc(res.Nodes, func(r scd.NodeResult) bool { return r.Env != "" })
	var failed, done []string
	for _, r := range res.Nodes {
		who := r.Node
		if perInstance {
			who += " (" + r.Env + ")" // a node fails or not per instance
		}
		if r.Error != "" {
			failed = append(failed, who)
		} else {
			done = append(done, who)
		}
	}
	var failure error
	if len(failed) > 0 {
		failure = fmt.Errorf("%s failed on node(s) %s", verb, strings.Join(failed, ", "))
	}
	if asJSON {
		return failure
	}
	if len(failed) > 0 {
		// The success headline would claim what the failed nodes did not do.
		what := verb
		if res.Env != "" {
			what += " " + res.Env
		}
		what += ": failed on " + strings.Join(failed, ", ")
		if len(done) > 0 {
			what += "; done on " + strings.Join(done, ", ")
		}
		fmt.Fprintln(stdout, what)
	} else {
		what := map[string]string{
			"quiesce": "quiesced %s: its servers finished their calls and stopped; none starts until scdctl resume %[1]s",
			"resume":  "resumed %s: a server starts on the next find or call",
			"refresh": "refreshed %s: its processes were replaced one at a time",
			"policy":  "read svcpolicy again",
		}[verb]
		if strings.Contains(what, "%") {
			fmt.Fprintf(stdout, what+"\n", res.Env)
		} else {
			fmt.Fprintln(stdout, what)
		}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	if perInstance {
		fmt.Fprintln(tw, "NODE\tINSTANCE\tRESULT")
	} else {
		fmt.Fprintln(tw, "NODE\tRESULT")
	}
	for _, r := range res.Nodes {
		node := r.Node
		if perInstance {
			node += "\t" + r.Env
		}
		if r.Error != "" {
			fmt.Fprintf(tw, "%s\terror: %s\n", node, r.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\n", node, r.Done)
	}
	tw.Flush()
	return failure
}

// report prints the node's workload activity report: per service class,
// its goal against what its calls did; per application environment, its
// servers and high-water mark.
func report(ctx context.Context, nd node, asJSON bool, args []string, stdout io.Writer) error {
	if len(args) != 0 {
		return usageError("report [-json]")
	}
	body, err := httpDo(ctx, http.DefaultClient, http.MethodGet, "http://"+nd.http+"/report", nd.http,
		httpHint)
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var r scd.Report
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("report: answer from %s: %w", nd.http, err)
	}
	printReport(stdout, r)
	return nil
}

func printReport(w io.Writer, r scd.Report) {
	fmt.Fprintf(w, "node %s: service policy %s, interval %gs, %d intervals; figures since %s\n",
		r.Node, r.Policy, r.Interval, r.Intervals, r.Since.Local().Format(time.DateTime))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLASS\tIMP\tGOAL\tPI\tACTUAL\tCALLS\tWITHIN-GOAL\tRESP-MS\tQUEUE-MS\tSERVICE-MS\tCPU-MS/CALL")
	for _, c := range r.Classes {
		pi, actual := "-", "-"
		if c.PI != nil {
			pi = fmt.Sprintf("%.2f", *c.PI)
		}
		if c.ActualMs != nil {
			actual = fmt.Sprintf("%.0fms", *c.ActualMs)
		}
		within := "-"
		if c.Calls > 0 {
			within = fmt.Sprintf("%.1f%%", c.WithinGoal*100)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%s\t%.1f\t%.1f\t%.1f\t%.2f\n", c.Class, c.Importance, c.Goal, pi, actual,
			c.Calls, within, c.ResponseMs, c.QueueMs, c.ServiceMs, c.CPUPerCall)
	}
	tw.Flush()
	fmt.Fprintln(w, "\nresponse time against the goal (calls up to each % of the goal's time):")
	tw = tabwriter.NewWriter(w, 0, 4, 1, ' ', tabwriter.AlignRight)
	if len(r.Classes) > 0 {
		fmt.Fprint(tw, "CLASS\t")
		for _, b := range r.Classes[0].Distribution {
			if b.UpToPercent == 0 {
				fmt.Fprint(tw, ">400%\t")
			} else {
				fmt.Fprintf(tw, "%d%%\t", b.UpToPercent)
			}
		}
		fmt.Fprintln(tw)
	}
	for _, c := range r.Classes {
		fmt.Fprintf(tw, "%s\t", c.Class)
		for _, b := range c.Distribution {
			fmt.Fprintf(tw, "%d\t", b.Calls)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	switch {
	case r.Missing != "" && r.Managed:
		fmt.Fprintf(w, "\nclass %s misses its goal: %s\n", r.Missing, r.Action)
		if g := r.Grow; g != nil {
			fmt.Fprintf(w, "last ask for one more server of %s (%s, decider %s): %s\n", g.Env, g.At.Format("15:04:05"), g.Decider, g.Result)
		}
	case r.Missing != "":
		fmt.Fprintf(w, "\nclass %s misses its goal; goal_management = N, so nothing is done (it would be: %s)\n", r.Missing, r.Action)
	case !r.Managed:
		fmt.Fprintln(w, "\ngoal_management = N: goals are measured and reported, not acted on")
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	instances := slices.ContainsFunc(r.Environments, func(e scd.EnvReport) bool { return e.Instance != "" })
	if instances {
		fmt.Fprintln(tw, "ENVIRONMENT\tINSTANCE\tHIGH-WATER\tQUIESCED\tHERE\tSERVERS\tCAN-SERVE\tDECIDER")
	} else {
		fmt.Fprintln(tw, "ENVIRONMENT\tHIGH-WATER\tQUIESCED\tHERE\tSERVERS\tCAN-SERVE\tDECIDER")
	}
	for _, e := range r.Environments {
		var servers []string
		for _, s := range e.Servers {
			x := s.Node
			if s.PI != nil {
				x += fmt.Sprintf(" (PI %.2f)", *s.PI)
			}
			servers = append(servers, x)
		}
		env := e.Env
		if instances {
			env = e.Environment + "\t" + dashIfEmpty(e.Instance)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", env, e.HighWaterMark, yn(e.Quiesced), dashIfEmpty(e.Here),
			dashIfEmpty(strings.Join(servers, ", ")), dashIfEmpty(strings.Join(e.CanServe, ", ")), dashIfEmpty(e.Decider))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSTATE\tCPU-WEIGHT\tBASE\tCPU-DELAY\tPI")
	for _, g := range r.Groups {
		delay, pi := "-", "-"
		if g.CPUDelay != nil {
			delay = fmt.Sprintf("%.0f%%", *g.CPUDelay*100)
		}
		if g.PI != nil {
			pi = fmt.Sprintf("%.2f", *g.PI)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", g.Group, dashIfEmpty(g.State), g.Weight, g.Base, delay, pi)
	}
	tw.Flush()
	var spare []string
	for i, s := range r.SpareCPUs {
		spare = append(spare, fmt.Sprintf("%d: %.2f", i+1, s))
	}
	fmt.Fprintf(w, "\nspare CPUs by importance: %s  (other programs: %.2f)\n", strings.Join(spare, "  "), r.OtherCPUs)
	if r.LoadError != "" {
		fmt.Fprintf(w, "(other programs' CPU use is not measured: %s)\n", r.LoadError)
	}
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
