// follow_status follows the fleet's status changes from Go: StatusChanged
// events from the STATUS stream (docs/subjects.md), from the beginning
// (-from-start) or from now, with an ordered consumer of its own; -radar
// follows the Radar feed instead. Build and
// run it with examples/go/run.sh, which generates the protobuf types from
// the repository's schemas/.
//
// Exits 0 after -limit events, 1 when fewer arrived within -timeout.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	fleetv1 "fleet/gen/go/fleet/v1"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

func main() {
	url := flag.String("url", "nats://127.0.0.1:4222", "NATS URL")
	user := flag.String("user", "", "NATS user (reader, nats.conf)")
	password := flag.String("password", "", "NATS password")
	root := flag.String("root", "fleet", "nats.subject_root")
	radarRoot := flag.String("radar-root", "radar", "nats.radar_root")
	radar := flag.Bool("radar", false, "follow the Radar feed instead")
	prefix := flag.String("stream-prefix", "", "nats.stream_prefix")
	fromStart := flag.Bool("from-start", false, "replay what the stream holds first")
	limit := flag.Int("limit", 0, "stop after this many events (0: never)")
	timeout := flag.Duration("timeout", 0, "give up after this long (0: never)")
	flag.Parse()

	opts := []nats.Option{nats.Name("follow-status-go")}
	if *user != "" {
		opts = append(opts, nats.UserInfo(*user, *password), nats.CustomInboxPrefix("_INBOX."+*user))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "follow_status:", err)
		os.Exit(1)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		fmt.Fprintln(os.Stderr, "follow_status:", err)
		os.Exit(1)
	}
	deliver := nats.DeliverNew()
	if *fromStart {
		deliver = nats.DeliverAll()
	}
	subject, stream := *root+".status.>", *prefix+"STATUS"
	if *radar {
		subject, stream = *radarRoot+".projection.v1.>", *prefix+"RADAR"
	}
	sub, err := js.SubscribeSync(subject, nats.BindStream(stream), nats.OrderedConsumer(), deliver)
	if err != nil {
		fmt.Fprintln(os.Stderr, "follow_status:", err)
		os.Exit(1)
	}
	var deadline time.Time
	if *timeout > 0 {
		deadline = time.Now().Add(*timeout)
	}
	seen := 0
	for *limit == 0 || seen < *limit {
		wait := time.Hour
		if !deadline.IsZero() {
			wait = time.Until(deadline)
			if wait <= 0 {
				break
			}
		}
		msg, err := sub.NextMsg(wait)
		if err == nats.ErrTimeout {
			if !deadline.IsZero() {
				break
			}
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "follow_status:", err)
			os.Exit(1)
		}
		if *radar {
			var r fleetv1.RadarProjection
			if err := proto.Unmarshal(msg.Data, &r); err != nil {
				fmt.Fprintln(os.Stderr, "follow_status: undecodable projection:", err)
				continue
			}
			fmt.Printf("%s %s %s %s\n", msg.Subject, r.GetDeviceId(), r.GetAvailability(), r.GetHealth())
			seen++
			continue
		}
		var e fleetv1.StatusChanged
		if err := proto.Unmarshal(msg.Data, &e); err != nil {
			fmt.Fprintln(os.Stderr, "follow_status: undecodable event:", err)
			continue
		}
		// Contract v2 (docs/subjects.md): a birth is one `device` event
		// with every axis's first value; a transaction's condition changes
		// are one `conditions` event.
		change := e.GetFromValue() + " -> " + e.GetTo()
		switch e.GetAxis() {
		case "device":
			change = "born"
			for _, a := range e.GetAxes() {
				change += " " + a.GetAxis() + "=" + a.GetValue()
			}
		case "conditions":
			change = ""
			for _, c := range e.GetConditions() {
				from := c.GetFromStatus()
				if from == "" {
					from = "(new)"
				}
				change += " " + c.GetConditionType() + ":" + from + "->" + c.GetToStatus()
			}
		}
		fmt.Printf("%s %s: %s v%d (schema v%d) %s trace %s\n", e.GetDeviceId(), e.GetAxis(), change,
			e.GetVersion(), e.GetSchemaVersion(), e.GetCause(), msg.Header.Get("traceparent"))
		seen++
	}
	if *limit > 0 && seen < *limit {
		fmt.Fprintf(os.Stderr, "follow_status: %d of %d events within %s\n", seen, *limit, *timeout)
		os.Exit(1)
	}
}
