// Hostile input through every RPC, from another gRPC stack: each method the coordinator and a
// worker serve, found through server reflection as grpcurl finds them, gets bytes that do not
// parse, an empty message, random messages built from its descriptor (edge values, long and
// odd strings, unknown enum numbers, nested messages) and those with a few bytes changed. The services must answer every call with
// a status before its deadline and go on serving; the report counts the codes per method.
package main

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Sends and receives bytes as they are, so that a request need not parse.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

var oddStrings = []string{"", "a", "0", "-1", "../../../../etc/passwd", "/dev/zero", "\x00\x01",
	"job:../x", "artifact:sha256:zz", "worker:/proc/self/mem", "http://127.0.0.1:1/x",
	"ünïcödé ☃", "%s%n%x", strings.Repeat("x", 300), strings.Repeat("y", 70000)}
var oddInts = []int64{0, 1, -1, 2, 7, 4096, 4097, math.MaxInt32, math.MinInt32, math.MaxInt64,
	math.MinInt64, 1 << 40}
var oddFloats = []float64{0, -0.0, 1, -1, 1e-45, 1e38, 1e308, math.NaN(), math.Inf(1), math.Inf(-1)}

// A random value of fd's kind; a message comes from newMessage (a list's element, a field's).
func randomValue(r *rand.Rand, fd protoreflect.FieldDescriptor,
	newMessage func() protoreflect.Message, depth int) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(r.Intn(2) == 1)
	case protoreflect.EnumKind:
		values := fd.Enum().Values()
		if r.Intn(4) == 0 {
			return protoreflect.ValueOfEnum(protoreflect.EnumNumber(99 + r.Intn(3)))
		}
		return protoreflect.ValueOfEnum(values.Get(r.Intn(values.Len())).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(oddInts[r.Intn(len(oddInts))]))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(oddInts[r.Intn(len(oddInts))])
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(oddInts[r.Intn(len(oddInts))]))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(oddInts[r.Intn(len(oddInts))]))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(oddFloats[r.Intn(len(oddFloats))]))
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(oddFloats[r.Intn(len(oddFloats))])
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(oddStrings[r.Intn(len(oddStrings))])
	case protoreflect.BytesKind:
		b := make([]byte, []int{0, 1, 3, 12, 64, 5000}[r.Intn(6)])
		r.Read(b)
		return protoreflect.ValueOfBytes(b)
	case protoreflect.MessageKind, protoreflect.GroupKind:
		child := newMessage()
		fill(r, child, depth+1)
		return protoreflect.ValueOfMessage(child)
	}
	panic(fmt.Sprintf("field kind %v", fd.Kind()))
}

// Sets about half of m's fields, recursing three levels deep.
func fill(r *rand.Rand, m protoreflect.Message, depth int) {
	if depth > 3 {
		return
	}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if r.Intn(2) == 0 {
			continue
		}
		switch {
		case fd.IsList():
			list := m.Mutable(fd).List()
			element := func() protoreflect.Message { return list.NewElement().Message() }
			for n := r.Intn(4); n > 0; n-- {
				list.Append(randomValue(r, fd, element, depth))
			}
		case fd.IsMap():
			entries := m.Mutable(fd).Map()
			for n := r.Intn(3); n > 0; n-- {
				key := randomValue(r, fd.MapKey(), nil, depth).MapKey()
				if fd.MapValue().Kind() == protoreflect.MessageKind {
					value := entries.NewValue()
					fill(r, value.Message(), depth+1)
					entries.Set(key, value)
				} else {
					entries.Set(key, randomValue(r, fd.MapValue(), nil, depth))
				}
			}
		default:
			field := func() protoreflect.Message { return m.NewField(fd).Message() }
			m.Set(fd, randomValue(r, fd, field, depth))
		}
	}
}

type hostileCall struct {
	conn    *grpc.ClientConn
	method  protoreflect.MethodDescriptor
	input   []byte
	garbage bool // bytes that cannot parse as any message
}

// One call of raw bytes; its status, or a failure when it outlived its deadline.
func (c hostileCall) run(deadline time.Duration) (*status.Status, error) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	service := c.method.Parent().(protoreflect.ServiceDescriptor)
	name := fmt.Sprintf("/%s/%s", service.FullName(), c.method.Name())
	started := time.Now()
	var err error
	if !c.method.IsStreamingClient() && !c.method.IsStreamingServer() {
		var out []byte
		err = c.conn.Invoke(ctx, name, &c.input, &out, grpc.ForceCodec(rawCodec{}))
	} else {
		desc := &grpc.StreamDesc{StreamName: string(c.method.Name()),
			ClientStreams: c.method.IsStreamingClient(), ServerStreams: c.method.IsStreamingServer()}
		var stream grpc.ClientStream
		stream, err = c.conn.NewStream(ctx, desc, name, grpc.ForceCodec(rawCodec{}))
		if err == nil {
			if err = stream.SendMsg(&c.input); err == nil || err.Error() == "EOF" {
				stream.CloseSend()
				for {
					var out []byte
					if err = stream.RecvMsg(&out); err != nil {
						break
					}
				}
			}
		}
	}
	if time.Since(started) > deadline+2*time.Second {
		return nil, fmt.Errorf("%s outlived its deadline: %v", name, time.Since(started))
	}
	if err != nil && err.Error() == "EOF" {
		return status.New(codes.OK, ""), nil // a server stream that ended cleanly
	}
	return status.Convert(err), nil
}

// The method's kind, as the report names it.
func kindOf(m protoreflect.MethodDescriptor) string {
	switch {
	case m.IsStreamingClient() && m.IsStreamingServer():
		return "bidi"
	case m.IsStreamingClient():
		return "client-streaming"
	case m.IsStreamingServer():
		return "server-streaming"
	}
	return "unary"
}

// Sweeps every method of every dtrain service at each address; returns the codes seen per
// method, and fails the program on a call that outlives its deadline or a service that stops.
func checkHostile(addresses []string, perMethod int, seed int64) map[string]map[string]int {
	r := rand.New(rand.NewSource(seed))
	var calls []hostileCall
	var conns []*grpc.ClientConn
	for _, address := range addresses {
		conn, err := grpc.Dial(address, grpc.WithInsecure(), grpc.WithBlock(),
			grpc.WithTimeout(20*time.Second))
		check(err, "dial "+address)
		conns = append(conns, conn)
		services, registry, _ := reflected(conn, reflectionV1)
		for _, s := range services {
			// dtrain's services, and the reflection v1 service dtrain serves itself.
			if !strings.HasPrefix(s, "dtrain.") && s != "grpc.reflection.v1.ServerReflection" {
				continue
			}
			d, err := registry.FindDescriptorByName(protoreflect.FullName(s))
			check(err, s+" in the reflected descriptors")
			methods := d.(protoreflect.ServiceDescriptor).Methods()
			for i := 0; i < methods.Len(); i++ {
				m := methods.Get(i)
				// Bytes that do not parse: a field 1 of wire type 7, which does not exist.
				calls = append(calls, hostileCall{conn, m, []byte{0x0f, 0xff, 0xff}, true})
				calls = append(calls, hostileCall{conn, m, nil, false})
				for n := 0; n < perMethod; n++ {
					msg := dynamicpb.NewMessage(m.Input())
					fill(r, msg, 0)
					data, err := proto.Marshal(msg)
					check(err, "marshalling a random "+string(m.Input().FullName()))
					calls = append(calls, hostileCall{conn, m, data, false})
					// And with a few bytes changed: broken lengths, tags, invalid UTF-8.
					if len(data) > 0 {
						flipped := append([]byte(nil), data...)
						for k := 1 + r.Intn(3); k > 0; k-- {
							flipped[r.Intn(len(flipped))] ^= byte(1 + r.Intn(255))
						}
						calls = append(calls, hostileCall{conn, m, flipped, false})
					}
				}
			}
		}
	}
	r.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })

	codesSeen := map[string]map[string]int{}
	// Per method, one answer per server that offers it (reflection v1: the coordinator and the
	// worker), each naming the server.
	garbage := map[string][]map[string]string{}
	var mu sync.Mutex
	var failures []string
	// 16 calls at a time; the unparsable bytes first, on their own and with a longer deadline,
	// so that no waiting call can delay them on a loaded machine.
	sweep := func(calls []hostileCall, deadline time.Duration) {
		work := make(chan hostileCall)
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for c := range work {
					answer, err := c.run(deadline)
					mu.Lock()
					if err != nil {
						failures = append(failures, err.Error())
					} else {
						key := string(c.method.FullName())
						if codesSeen[key] == nil {
							codesSeen[key] = map[string]int{}
						}
						codesSeen[key][answer.Code().String()]++
						if c.garbage {
							garbage[key] = append(garbage[key], map[string]string{
								"code": answer.Code().String(), "message": answer.Message(),
								"kind": kindOf(c.method), "server": c.conn.Target()})
						}
					}
					mu.Unlock()
				}
			}()
		}
		for _, c := range calls {
			work <- c
		}
		close(work)
		wg.Wait()
	}
	var first, rest []hostileCall
	for _, c := range calls {
		if c.garbage {
			first = append(first, c)
		} else {
			rest = append(rest, c)
		}
	}
	sweep(first, 10*time.Second)
	sweep(rest, 5*time.Second)
	if len(failures) > 0 {
		sort.Strings(failures)
		fail("hostile input: %d calls outlived their deadlines, first %s", len(failures), failures[0])
	}
	// Every service still serves.
	for i, conn := range conns {
		ctx, cancel := timed(10)
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		check(err, "health after the hostile calls at "+addresses[i])
		if h.Status != healthpb.HealthCheckResponse_SERVING {
			fail("%s is %v after the hostile calls", addresses[i], h.Status)
		}
		conn.Close()
	}
	report["hostile_calls"] = len(calls)
	report["hostile_garbage"] = garbage
	return codesSeen
}
