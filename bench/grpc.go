package bench

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The gRPC peer: service bench.Echo with unary methods Echo and Burn, both
// taking and returning a google.protobuf.BytesValue, so the messages are
// real protobuf without generated code of our own. The service descriptor
// below is what protoc-gen-go-grpc would write for
//
//	service Echo {
//	  rpc Echo(google.protobuf.BytesValue) returns (google.protobuf.BytesValue);
//	  rpc Burn(google.protobuf.BytesValue) returns (google.protobuf.BytesValue);
//	}
var grpcEchoDesc = grpc.ServiceDesc{
	ServiceName: "bench.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Echo", Handler: grpcHandler(func(b []byte) {})},
		{MethodName: "Burn", Handler: grpcHandler(func(b []byte) { Burn(ParseMicros(b)) })},
	},
	Metadata: "bench.proto",
}

func grpcHandler(work func([]byte)) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(wrapperspb.BytesValue)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(_ context.Context, req any) (any, error) {
			work(req.(*wrapperspb.BytesValue).Value)
			return req, nil
		}
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/bench.Echo/"}, h)
	}
}

// ServeGRPC runs the gRPC echo peer on addr until ctx ends.
func ServeGRPC(ctx context.Context, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	s.RegisterService(&grpcEchoDesc, struct{}{})
	context.AfterFunc(ctx, s.GracefulStop)
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// grpcCaller makes unary calls on a ClientConn of its own (one HTTP/2
// connection per load-generator connection, as the other protocols have).
type grpcCaller struct {
	method string
	once   sync.Once
	cc     *grpc.ClientConn
	err    error
	out    wrapperspb.BytesValue
	in     wrapperspb.BytesValue
}

// GRPCDialer calls method ("Echo" or "Burn") of bench.Echo at addr.
func GRPCDialer(addr, method string) Dialer {
	return func() Caller {
		c := &grpcCaller{method: "/bench.Echo/" + method}
		c.cc, c.err = grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		return c
	}
}

func (c *grpcCaller) Call(payload []byte, deadline time.Time) (Outcome, error) {
	if c.err != nil {
		return Failed, c.err
	}
	ctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	c.out.Value = payload
	c.in.Value = c.in.Value[:0]
	if err := c.cc.Invoke(ctx, c.method, &c.out, &c.in); err != nil {
		switch status.Code(err) {
		case codes.DeadlineExceeded:
			return TimedOut, nil
		case codes.ResourceExhausted, codes.Unavailable:
			return Refused, nil
		}
		return Failed, nil
	}
	return OK, checkEcho(c.in.Value, payload)
}

func (c *grpcCaller) Close() error {
	c.once.Do(func() {
		if c.cc != nil {
			c.cc.Close()
		}
	})
	return nil
}
