package bench

import (
	"context"
	"errors"
	"net"
	"time"

	"google.golang.org/grpc"
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
		{MethodName: "Burn", Handler: grpcHandler(func(b []byte) { burn(parseMicros(b)) })},
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
	// Calls in flight finish; a client that keeps an idle connection open
	// does not hold the stop up beyond a second.
	context.AfterFunc(ctx, func() {
		hard := time.AfterFunc(time.Second, s.Stop)
		s.GracefulStop()
		hard.Stop()
	})
	if err := s.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}
