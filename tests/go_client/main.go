// A Go user's client of a dtrain cluster, built on grpc-go (Debian's golang-google-grpc-dev) with
// stubs protoc-gen-go and protoc-gen-go-grpc generate from proto/ at build time: the public API
// as another language's default gRPC stack reads it, with default channel settings throughout.
// tests/python/test_go_client.py runs it against a real local cluster and checks its report.
//
// Each check fails loudly: the program prints what differed and exits 1. On success it prints
// one JSON report on stdout, which the Python side compares with what it knows.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	pb "dtrain/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

var report = map[string]interface{}{}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "go client: "+format+"\n", args...)
	os.Exit(1)
}

func check(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

// expectCode checks that err is a gRPC status with the code and a message that names `names`.
func expectCode(err error, code codes.Code, names string, what string) string {
	s, ok := status.FromError(err)
	if err == nil || !ok {
		fail("%s: expected %v, got %v", what, code, err)
	}
	if s.Code() != code || !strings.Contains(s.Message(), names) {
		fail("%s: expected %v naming %q, got %v: %q", what, code, names, s.Code(), s.Message())
	}
	return s.Message()
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

func timed(seconds int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(seconds)*time.Second)
}

// The standard health protocol, as load balancers and Kubernetes probes ask it.
func checkHealth(conn *grpc.ClientConn) {
	ctx, cancel := timed(10)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	check(err, "grpc.health.v1.Health/Check")
	if r.Status != healthpb.HealthCheckResponse_SERVING {
		fail("health: %v, expected SERVING", r.Status)
	}
	report["health"] = r.Status.String()
}

// The two protocols' reflection methods: grpcurl asks for v1 first, then falls back to v1alpha.
// grpc-go 1.33 has only v1alpha's stubs, but v1's messages are v1alpha's on the wire.
const (
	reflectionV1      = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	reflectionV1alpha = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
)

// A server's services through reflection (`method`, one of the two above), and every file they
// need, imports too, fetched by name and linked into descriptors as grpcurl resolves them; and
// the files' names.
func reflected(conn *grpc.ClientConn, method string) ([]string, *protoregistry.Files, []string) {
	ctx, cancel := timed(20)
	defer cancel()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
		method)
	check(err, "reflection stream "+method)
	ask := func(req *rpb.ServerReflectionRequest) *rpb.ServerReflectionResponse {
		check(stream.SendMsg(req), "reflection send")
		r := &rpb.ServerReflectionResponse{}
		err := stream.RecvMsg(r)
		check(err, "reflection receive")
		if e := r.GetErrorResponse(); e != nil {
			fail("reflection: %v answered %d %s", req.MessageRequest, e.ErrorCode, e.ErrorMessage)
		}
		return r
	}
	listed := ask(&rpb.ServerReflectionRequest{
		MessageRequest: &rpb.ServerReflectionRequest_ListServices{ListServices: ""}})
	var services []string
	for _, s := range listed.GetListServicesResponse().Service {
		services = append(services, s.Name)
	}
	sort.Strings(services)

	files := map[string]*descriptorpb.FileDescriptorProto{}
	var add func(r *rpb.ServerReflectionResponse)
	add = func(r *rpb.ServerReflectionResponse) {
		for _, raw := range r.GetFileDescriptorResponse().FileDescriptorProto {
			fd := &descriptorpb.FileDescriptorProto{}
			check(proto.Unmarshal(raw, fd), "a reflected file descriptor")
			if _, seen := files[fd.GetName()]; seen {
				continue
			}
			files[fd.GetName()] = fd
			for _, dep := range fd.Dependency {
				if _, seen := files[dep]; !seen {
					add(ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.
						ServerReflectionRequest_FileByFilename{FileByFilename: dep}}))
				}
			}
		}
	}
	for _, s := range services {
		if strings.HasPrefix(s, "dtrain.") || s == "grpc.reflection.v1.ServerReflection" {
			add(ask(&rpb.ServerReflectionRequest{MessageRequest: &rpb.
				ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: s}}))
		}
	}
	set := &descriptorpb.FileDescriptorSet{}
	var names []string
	for name, fd := range files {
		set.File = append(set.File, fd)
		names = append(names, name)
	}
	sort.Strings(names)
	registry, err := protodesc.NewFiles(set)
	check(err, "the reflected descriptors do not link")
	return services, registry, names
}

// What grpcurl does without .proto files: list the services through server reflection, resolve
// each one's file and its imports into descriptors, and call a method with dynamic messages.
func checkReflection(conn *grpc.ClientConn) {
	ctx, cancel := timed(20)
	defer cancel()
	services, registry, names := reflected(conn, reflectionV1alpha)
	report["services"] = services
	report["reflected_files"] = names
	servicesV1, _, namesV1 := reflected(conn, reflectionV1)
	report["services_v1"] = servicesV1
	report["reflected_files_v1"] = namesV1

	// Jobs.ListJobs with messages built from the descriptors alone.
	d, err := registry.FindDescriptorByName("dtrain.v1.Jobs")
	check(err, "dtrain.v1.Jobs in the reflected descriptors")
	method := d.(protoreflect.ServiceDescriptor).Methods().ByName("ListJobs")
	if method == nil {
		fail("reflection: dtrain.v1.Jobs has no ListJobs")
	}
	in := dynamicpb.NewMessage(method.Input())
	check(protojson.Unmarshal([]byte(`{"page_size": 5}`), in), "ListJobs request from JSON")
	out := dynamicpb.NewMessage(method.Output())
	check(conn.Invoke(ctx, "/dtrain.v1.Jobs/ListJobs", in, out), "dynamic ListJobs")
	text, err := protojson.Marshal(out)
	check(err, "ListJobs answer to JSON")
	report["dynamic_list_jobs"] = string(text)
}

// ListWorkers one worker a page, as a client with a small page_size reads a long list.
func checkWorkers(conn *grpc.ClientConn) {
	ctx, cancel := timed(20)
	defer cancel()
	client := pb.NewWorkersClient(conn)
	var names []string
	token, pages := "", 0
	for {
		r, err := client.ListWorkers(ctx, &pb.ListWorkersRequest{PageSize: 1, PageToken: token})
		check(err, "ListWorkers")
		pages++
		for _, w := range r.Workers {
			names = append(names, w.Name)
		}
		if r.NextPageToken == "" {
			break
		}
		if r.NextPageToken == token || pages > 100 {
			fail("ListWorkers: the page token does not move (%q)", token)
		}
		token = r.NextPageToken
	}
	report["workers"] = names
	report["worker_pages"] = pages
	_, err := client.ListWorkers(ctx, &pb.ListWorkersRequest{PageSize: -1})
	report["negative_page_size"] = expectCode(err, codes.InvalidArgument, "page_size",
		"ListWorkers page_size -1")
}

func float32Bytes(values []float32) []byte {
	out := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// One rank of a group formed from Go: register, heartbeat, collectives, leave.
type rank struct {
	client     pb.CoordinatorClient
	assignment *pb.RegisterResponse
	sequence   int64
	stop       chan struct{} // closed to stop heartbeats
	stopped    chan struct{} // closed once they stopped, so none follows Leave
}

// Heartbeats at the interval the coordinator gave, until Leave: without them the coordinator
// declares the rank dead after heartbeat_timeout_ms, however slowly the machine runs the test.
func (r *rank) heartbeat() {
	interval := time.Duration(r.assignment.HeartbeatIntervalMs) * time.Millisecond
	if interval <= 0 {
		fail("Register gave heartbeat_interval_ms %d", r.assignment.HeartbeatIntervalMs)
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	defer close(r.stopped)
	for {
		select {
		case <-r.stop:
			return
		case <-ticker.C:
			ctx, cancel := timed(5)
			_, err := r.client.Heartbeat(ctx, &pb.HeartbeatRequest{Member: r.assignment.Member})
			cancel()
			check(err, "Heartbeat")
		}
	}
}

func (r *rank) context() *pb.CollectiveContext {
	c := &pb.CollectiveContext{Member: r.assignment.Member, Sequence: r.sequence}
	r.sequence++
	return c
}

func (r *rank) allReduce(values []float32) ([]float32, error) {
	return r.allReduceRaw([]int64{int64(len(values))}, float32Bytes(values))
}

// A float32 sum of `shape` over `payload`, which a caller may make disagree with the shape.
func (r *rank) allReduceRaw(shape []int64, payload []byte) ([]float32, error) {
	ctx, cancel := timed(30)
	defer cancel()
	stream, err := r.client.AllReduce(ctx)
	if err != nil {
		return nil, err
	}
	header := &pb.AllReduceHeader{Context: r.context(), Op: pb.ReduceOp_REDUCE_OP_SUM,
		Meta: &pb.TensorMeta{Dtype: pb.DType_DTYPE_FLOAT32, Shape: shape}}
	// A server that refuses the call may end the stream first: its status comes with Recv.
	err = stream.Send(&pb.AllReduceRequest{Header: header, Chunk: payload})
	if err != nil && err != io.EOF {
		return nil, err
	}
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	parts, data, err := collect(receiver(stream.Recv))
	if status.Code(err) == codes.InvalidArgument {
		r.sequence-- // a refused call is not counted (docs/coordinator.md, Errors)
	}
	if err != nil {
		return nil, err
	}
	if len(parts) != 1 || !sameMeta(parts[0], pb.DType_DTYPE_FLOAT32, shape) ||
		len(data) != len(payload) {
		return nil, fmt.Errorf("result %v of %d bytes for float32%v", parts, len(data), shape)
	}
	out := make([]float32, len(payload)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return out, nil
}

// What every tensor collective's answer message holds.
type resultMessage interface {
	GetHeader() *pb.ResultHeader
	GetChunk() []byte
}

// A collective stream's Recv, as collect reads it.
func receiver[M resultMessage](recv func() (M, error)) func() (*pb.ResultHeader, []byte, error) {
	return func() (*pb.ResultHeader, []byte, error) {
		m, err := recv()
		if err != nil {
			return nil, nil, err
		}
		return m.GetHeader(), m.GetChunk(), nil
	}
}

// A tensor collective's answer: the result header in the first message only, then the parts'
// bytes, concatenated.
func collect(recv func() (*pb.ResultHeader, []byte, error)) ([]*pb.TensorMeta, []byte, error) {
	var parts []*pb.TensorMeta
	var data []byte
	for i := 0; ; i++ {
		header, chunk, err := recv()
		if err == io.EOF {
			if i == 0 {
				return nil, nil, fmt.Errorf("the result stream ended without a message")
			}
			return parts, data, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if (header != nil) != (i == 0) {
			return nil, nil, fmt.Errorf("result message %d: header present %v", i, header != nil)
		}
		if header != nil {
			parts = header.Parts
		}
		data = append(data, chunk...)
	}
}

// Whether meta is a dtype of shape, as the answer to what a rank sent.
func sameMeta(meta *pb.TensorMeta, dtype pb.DType, shape []int64) bool {
	return meta.GetDtype() == dtype && fmt.Sprint(meta.GetShape()) == fmt.Sprint(shape)
}

// Rank r gathers (r+1) x 2 int32s: parts of uneven first dimensions, in rank order.
func (r *rank) allGather() ([]*pb.TensorMeta, []byte, error) {
	ctx, cancel := timed(30)
	defer cancel()
	stream, err := r.client.AllGather(ctx)
	if err != nil {
		return nil, nil, err
	}
	rows := int64(r.assignment.Rank) + 1
	payload := make([]byte, 8*rows)
	for i := int64(0); i < 2*rows; i++ {
		binary.LittleEndian.PutUint32(payload[4*i:], uint32(100*int64(r.assignment.Rank)+i))
	}
	header := &pb.AllGatherHeader{Context: r.context(),
		Meta: &pb.TensorMeta{Dtype: pb.DType_DTYPE_INT32, Shape: []int64{rows, 2}}}
	// A server that refuses the call may end the stream first: its status comes with Recv.
	err = stream.Send(&pb.AllGatherRequest{Header: header, Chunk: payload})
	if err != nil && err != io.EOF {
		return nil, nil, err
	}
	if err := stream.CloseSend(); err != nil {
		return nil, nil, err
	}
	return collect(receiver(stream.Recv))
}

// Rank 1 broadcasts opaque bytes; the other ranks send only the header.
func (r *rank) broadcastBytes(message []byte) ([]byte, error) {
	ctx, cancel := timed(30)
	defer cancel()
	stream, err := r.client.Broadcast(ctx)
	if err != nil {
		return nil, err
	}
	header := &pb.BroadcastHeader{Context: r.context(), Src: 1,
		Kind: pb.PayloadKind_PAYLOAD_KIND_BYTES}
	var chunk []byte
	if r.assignment.Rank == 1 {
		header.Meta = &pb.TensorMeta{Dtype: pb.DType_DTYPE_UINT8, Shape: []int64{int64(len(message))}}
		chunk = message
	}
	// A server that refuses the call may end the stream first: its status comes with Recv.
	err = stream.Send(&pb.BroadcastRequest{Header: header, Chunk: chunk})
	if err != nil && err != io.EOF {
		return nil, err
	}
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	parts, data, err := collect(receiver(stream.Recv))
	if err == nil && (len(parts) != 1 ||
		!sameMeta(parts[0], pb.DType_DTYPE_UINT8, []int64{int64(len(message))})) {
		return nil, fmt.Errorf("broadcast result %v for %d bytes", parts, len(message))
	}
	return data, err
}

func checkGroup(conn *grpc.ClientConn) {
	const world = 2
	ranks := make([]*rank, world)
	var wg sync.WaitGroup
	errs := make([]error, world)
	for i := 0; i < world; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ctx, cancel := timed(30)
			defer cancel()
			client := pb.NewCoordinatorClient(conn)
			a, err := client.Register(ctx, &pb.RegisterRequest{Group: "go", Host: "go-host",
				LocalDevices: 1, Incarnation: uint64(1000 + i), WorldSize: world,
				Name: fmt.Sprintf("go%d", i), OrderKey: fmt.Sprintf("%d", i)})
			errs[i] = err
			if err == nil {
				ranks[a.Rank] = &rank{client: client, assignment: a,
					stop: make(chan struct{}), stopped: make(chan struct{})}
				go ranks[a.Rank].heartbeat()
			}
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		check(err, fmt.Sprintf("Register of go%d", i))
	}
	var members []string
	for _, m := range ranks[0].assignment.Members {
		members = append(members, fmt.Sprintf("%d:%s", m.Rank, m.Name))
	}
	report["members"] = members

	// Runs body on every rank at once, leaving each rank's error in errs.
	run := func(body func(r *rank) error) {
		var wg sync.WaitGroup
		for i := range ranks {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				errs[i] = body(ranks[i])
			}(i)
		}
		wg.Wait()
	}
	// The same, where any rank's error ends the program, naming the call and the rank.
	runAll := func(what string, body func(r *rank) error) {
		run(body)
		for i, err := range errs {
			check(err, fmt.Sprintf("%s on rank %d", what, i))
		}
	}

	// Rank r all-reduces [r+1, 2(r+1), 0.5, -r].
	sums := make([][]float32, world)
	runAll("AllReduce", func(r *rank) error {
		f := float32(r.assignment.Rank)
		out, err := r.allReduce([]float32{f + 1, 2 * (f + 1), 0.5, -f})
		sums[r.assignment.Rank] = out
		return err
	})
	report["all_reduce"] = sums
	// Rank 1 votes true, rank 0 false: any is true, all is false, on both ranks.
	decide := func(all bool) []bool {
		out := make([]bool, world)
		runAll(fmt.Sprintf("ReduceBooleanDecision (all=%v)", all), func(r *rank) error {
			ctx, cancel := timed(30)
			defer cancel()
			d, err := r.client.ReduceBooleanDecision(ctx, &pb.ReduceBooleanDecisionRequest{
				Context: r.context(), Decision: r.assignment.Rank == 1, All: all})
			if err == nil {
				out[r.assignment.Rank] = d.Decision
			}
			return err
		})
		return out
	}
	report["any"] = decide(false)
	report["all"] = decide(true)
	runAll("Barrier", func(r *rank) error {
		ctx, cancel := timed(30)
		defer cancel()
		_, err := r.client.Barrier(ctx, &pb.BarrierRequest{Context: r.context(), Name: "go"})
		return err
	})

	gathered := make([]string, world)
	runAll("AllGather", func(r *rank) error {
		parts, data, err := r.allGather()
		if err != nil {
			return err
		}
		var shapes []string
		for _, p := range parts {
			shapes = append(shapes, fmt.Sprint(p.Shape))
		}
		values := make([]uint32, len(data)/4)
		for i := range values {
			values[i] = binary.LittleEndian.Uint32(data[4*i:])
		}
		gathered[r.assignment.Rank] = fmt.Sprint(shapes, values)
		return nil
	})
	report["all_gather"] = gathered
	broadcast := make([]string, world)
	runAll("Broadcast", func(r *rank) error {
		data, err := r.broadcastBytes([]byte("from rank 1, in Go"))
		broadcast[r.assignment.Rank] = string(data)
		return err
	})
	report["broadcast"] = broadcast

	// A malformed call (3 floats announced, 2 sent) is refused, and not counted: both ranks'
	// next call is still call k.
	_, err := ranks[0].allReduceRaw([]int64{3}, float32Bytes([]float32{1, 2}))
	report["short_payload"] = expectCode(err, codes.InvalidArgument, "payload",
		"AllReduce of a short payload")
	runAll("AllReduce after a refused call", func(r *rank) error {
		out, err := r.allReduce([]float32{float32(r.assignment.Rank) + 10})
		if err == nil && out[0] != 21 {
			return fmt.Errorf("after the refused call: %v, expected [21]", out)
		}
		return err
	})

	// Mismatched calls: rank 0 all-reduces 4 floats, rank 1 five. Both hear it, by rank.
	run(func(r *rank) error {
		_, err := r.allReduce(make([]float32, 4+int(r.assignment.Rank)))
		return err
	})
	var mismatch []string
	for i, err := range errs {
		mismatch = append(mismatch, expectCode(err, codes.FailedPrecondition, "does not match",
			fmt.Sprintf("mismatched AllReduce on rank %d", i)))
	}
	report["mismatch"] = mismatch

	for _, r := range ranks {
		close(r.stop)
		<-r.stopped
		ctx, cancel := timed(10)
		_, err := r.client.Leave(ctx, &pb.LeaveRequest{Member: r.assignment.Member})
		cancel()
		check(err, "Leave")
	}
}

// Three values of 3 MB each: a default 4 MiB receive limit reads them a page each.
func checkKeyValuePages(conn *grpc.ClientConn) {
	ctx, cancel := timed(60)
	defer cancel()
	client := pb.NewCoordinatorClient(conn)
	for i := 0; i < 3; i++ {
		value := bytes.Repeat([]byte{byte('a' + i)}, 3_000_000)
		_, err := client.KeyValueSet(ctx, &pb.KeyValueSetRequest{Scope: "go-kv",
			Key: fmt.Sprintf("big/%d", i), Value: value})
		check(err, "KeyValueSet")
	}
	var keys []string
	token, pages := "", 0
	for {
		r, err := client.KeyValueList(ctx, &pb.KeyValueListRequest{Scope: "go-kv", Prefix: "big/",
			PageToken: token})
		check(err, "KeyValueList")
		pages++
		for _, e := range r.Entries {
			if len(e.Value) != 3_000_000 || e.Value[0] != byte('a'+len(keys)) {
				fail("KeyValueList: %s came back as %d bytes", e.Key, len(e.Value))
			}
			keys = append(keys, e.Key)
		}
		if r.NextPageToken == "" || pages > 10 {
			break
		}
		token = r.NextPageToken
	}
	report["kv_keys"] = keys
	report["kv_pages"] = pages
}

// A client-streaming upload of 5 MB (two chunks under the 4 MiB limit), stored once, read back
// whole; bytes that do not hash to the announced digest are refused as DATA_LOSS.
func checkUpload(conn *grpc.ClientConn) {
	ctx, cancel := timed(60)
	defer cancel()
	artifacts := pb.NewArtifactsClient(conn)
	data := make([]byte, 5_000_000)
	for i := range data {
		data[i] = byte(i * 7 % 251)
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	const chunkBytes = 4<<20 - 64<<10
	upload := func(announced string) (*pb.UploadResponse, error) {
		stream, err := artifacts.Upload(ctx)
		if err != nil {
			return nil, err
		}
		header := &pb.UploadHeader{Digest: announced, Size: int64(len(data)), Name: "go.bin"}
		for offset := 0; offset < len(data); offset += chunkBytes {
			m := &pb.UploadRequest{Chunk: data[offset:min(offset+chunkBytes, len(data))]}
			if offset == 0 {
				m.Header = header
			}
			if err := stream.Send(m); err == io.EOF {
				break // refused early: CloseAndRecv has the status
			} else if err != nil {
				return nil, err
			}
		}
		return stream.CloseAndRecv()
	}
	first, err := upload(digest)
	check(err, "Artifacts.Upload")
	again, err := upload(digest)
	check(err, "Artifacts.Upload again")
	stat, err := artifacts.Stat(ctx, &pb.StatRequest{Digest: digest})
	check(err, "Artifacts.Stat")
	fetch, err := artifacts.Fetch(ctx, &pb.FetchRequest{Digest: digest, Offset: 1_000_000})
	check(err, "Artifacts.Fetch from an offset")
	var back []byte
	for {
		m, err := fetch.Recv()
		if err == io.EOF {
			break
		}
		check(err, "Artifacts.Fetch stream")
		back = append(back, m.Chunk...)
	}
	if !bytes.Equal(back, data[1_000_000:]) {
		fail("Fetch from offset 1,000,000: %d bytes back, not the upload's", len(back))
	}
	other := sha256.Sum256([]byte("something else"))
	_, err = upload("sha256:" + hex.EncodeToString(other[:]))
	report["upload"] = map[string]interface{}{
		"size": first.Size, "already_stored": []bool{first.AlreadyStored, again.AlreadyStored},
		"stat_size": stat.Size, "digest_matches": first.Digest == digest,
		"wrong_digest": expectCode(err, codes.DataLoss, "hash to",
			"an upload under another digest"),
	}
}

// A job from a JSON spec, watched to its end, then its metrics, its log and its last
// checkpoint read back; the checkpoint's bytes are written for torch to load.
func checkJob(conn *grpc.ClientConn, specJSON string, checkpointOut string) {
	ctx, cancel := timed(300)
	defer cancel()
	jobs := pb.NewJobsClient(conn)

	spec := &pb.JobSpec{}
	check(protojson.Unmarshal([]byte(specJSON), spec), "the job spec from JSON")
	bad := proto.Clone(spec).(*pb.JobSpec)
	bad.Data.BatchSize = -3
	_, err := jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: bad, ValidateOnly: true})
	report["bad_spec"] = expectCode(err, codes.InvalidArgument, "data.batch_size",
		"SubmitJob with batch_size -3")
	_, err = jobs.GetJob(ctx, &pb.GetJobRequest{Id: "no-such-job"})
	report["unknown_job"] = expectCode(err, codes.NotFound, "no-such-job", "GetJob of an unknown id")

	submitted, err := jobs.SubmitJob(ctx, &pb.SubmitJobRequest{Spec: spec})
	check(err, "SubmitJob")
	id := submitted.Job.Id
	report["job_id"] = id

	watch, err := jobs.WatchJob(ctx, &pb.WatchJobRequest{Id: id})
	check(err, "WatchJob")
	var last *pb.JobStatus
	updates := 0
	for {
		s, err := watch.Recv()
		if err == io.EOF {
			break
		}
		check(err, "WatchJob stream")
		updates++
		last = s
	}
	if last == nil {
		fail("WatchJob: no update")
	}
	report["watch_updates"] = updates
	report["state"] = last.State.String()
	report["reason"] = last.Reason
	report["global_step"] = last.Progress.GetGlobalStep()
	report["metrics"] = last.Metrics

	// The metric history, page by page.
	points := map[string]int{}
	from := int64(0)
	for {
		r, err := jobs.GetJobMetrics(ctx, &pb.GetJobMetricsRequest{Id: id, FromPoint: from})
		check(err, "GetJobMetrics")
		for _, p := range r.Points {
			points[p.Name]++
		}
		if r.Truncated && r.NextPoint <= from {
			fail("GetJobMetrics: next_point %d does not move past %d", r.NextPoint, from)
		}
		from = r.NextPoint
		if !r.Truncated {
			break
		}
	}
	report["metric_points"] = points

	tested, lines := "", int64(0)
	for {
		logs, err := jobs.GetJobLogs(ctx, &pb.GetJobLogsRequest{Id: id, FromLine: lines})
		check(err, "GetJobLogs")
		for _, line := range logs.Lines {
			if strings.Contains(line, "test: test_acc=") {
				tested = line
			}
		}
		if logs.NextLine <= lines && logs.Truncated {
			fail("GetJobLogs: next_line %d does not move past %d", logs.NextLine, lines)
		}
		lines = logs.NextLine
		if !logs.Truncated {
			break
		}
	}
	report["test_log_line"] = tested
	report["log_lines"] = lines

	report["event_tags"] = readEvents(last.LogDir)

	// The last checkpoint from the coordinator's store, verified by its digest.
	status, err := jobs.GetJob(ctx, &pb.GetJobRequest{Id: id})
	check(err, "GetJob")
	var lastCkpt *pb.JobFile
	for _, f := range status.Files {
		if f.Name == "last.ckpt" {
			lastCkpt = f
		}
	}
	if lastCkpt == nil {
		fail("GetJob: no last.ckpt among %v", status.Files)
	}
	fetch, err := pb.NewArtifactsClient(conn).Fetch(ctx, &pb.FetchRequest{Digest: lastCkpt.Digest})
	check(err, "Artifacts.Fetch")
	var data []byte
	size := int64(-1)
	for {
		m, err := fetch.Recv()
		if err == io.EOF {
			break
		}
		check(err, "Artifacts.Fetch stream")
		if size < 0 {
			size = m.Size
		}
		data = append(data, m.Chunk...)
	}
	sum := sha256.Sum256(data)
	if "sha256:"+hex.EncodeToString(sum[:]) != lastCkpt.Digest || int64(len(data)) != size {
		fail("Fetch: %d bytes of %d, digest mismatch against %s", len(data), size, lastCkpt.Digest)
	}
	check(os.WriteFile(checkpointOut, data, 0o644), "writing the checkpoint")
	report["checkpoint_bytes"] = len(data)
}

// A coordinator with mutual TLS and a token, through Go's own TLS stack (crypto/tls, not the
// OpenSSL or BoringSSL the C core uses): the handshake, ALPN's h2 (which newer grpc-go
// requires), the bearer token, and the refusals without a token or a client certificate.
func checkSecure(address, caFile, certFile, keyFile, token string) {
	pem, err := os.ReadFile(caFile)
	check(err, "reading the CA")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		fail("no certificate in %s", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	check(err, "reading the client certificate")
	creds := credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}})
	conn, err := grpc.Dial(address, grpc.WithTransportCredentials(creds), grpc.WithBlock(),
		grpc.WithTimeout(10*time.Second))
	check(err, "TLS dial "+address)
	defer conn.Close()

	ctx, cancel := timed(20)
	defer cancel()
	authorized := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	var from peer.Peer
	_, err = pb.NewJobsClient(conn).ListJobs(authorized, &pb.ListJobsRequest{}, grpc.Peer(&from))
	check(err, "ListJobs over TLS with the token")
	info, ok := from.AuthInfo.(credentials.TLSInfo)
	if !ok {
		fail("ListJobs: the connection's peer is not TLS (%T)", from.AuthInfo)
	}
	report["alpn"] = info.State.NegotiatedProtocol
	report["tls_version"] = info.State.Version

	_, err = pb.NewJobsClient(conn).ListJobs(ctx, &pb.ListJobsRequest{})
	report["no_token"] = expectCode(err, codes.Unauthenticated, "bearer token",
		"ListJobs without the token")
	wrong := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer not-"+token)
	_, err = pb.NewJobsClient(conn).ListJobs(wrong, &pb.ListJobsRequest{})
	report["wrong_token"] = expectCode(err, codes.Unauthenticated, "not",
		"ListJobs with a wrong token")

	// The coordinator requires a client certificate: without one the handshake fails, and the
	// call says so at once (UNAVAILABLE, not a deadline that ran out while it retried).
	anonymous := credentials.NewTLS(&tls.Config{RootCAs: roots})
	bare, err := grpc.Dial(address, grpc.WithTransportCredentials(anonymous))
	check(err, "TLS dial without a client certificate")
	defer bare.Close()
	short, cancelShort := timed(5)
	defer cancelShort()
	_, err = pb.NewJobsClient(bare).ListJobs(
		metadata.AppendToOutgoingContext(short, "authorization", "Bearer "+token), &pb.ListJobsRequest{})
	report["no_client_certificate"] = expectCode(err, codes.Unavailable, "",
		"ListJobs from a client without a certificate")
}

// TensorBoard's record framing read with Go's own CRC-32C (hash/crc32's Castagnoli table), not
// the hand-written one that wrote it: each record is its length (8 bytes, little-endian), the
// length's masked CRC, the data and the data's masked CRC. The log directory is local here.
func readEvents(logDir string) map[string]int {
	files, err := filepath.Glob(filepath.Join(logDir, "events.out.tfevents.*"))
	check(err, "listing the event files")
	if len(files) != 1 {
		fail("events: %d event files in %s, expected 1", len(files), logDir)
	}
	data, err := os.ReadFile(files[0])
	check(err, "reading "+files[0])
	table := crc32.MakeTable(crc32.Castagnoli)
	masked := func(b []byte) uint32 {
		c := crc32.Checksum(b, table)
		return ((c >> 15) | (c << 17)) + 0xa282ead8
	}
	tags := map[string]int{}
	for offset, record := 0, 0; offset < len(data); record++ {
		if len(data)-offset < 12 {
			fail("events: record %d cut short at byte %d", record, offset)
		}
		length := binary.LittleEndian.Uint64(data[offset:])
		if masked(data[offset:offset+8]) != binary.LittleEndian.Uint32(data[offset+8:]) {
			fail("events: record %d's length fails its CRC-32C", record)
		}
		body := offset + 12
		if rest := uint64(len(data) - body); length > rest || rest-length < 4 {
			fail("events: record %d of %d bytes runs past the file", record, length)
		}
		payload := data[body : body+int(length)]
		if masked(payload) != binary.LittleEndian.Uint32(data[body+int(length):]) {
			fail("events: record %d's data fails its CRC-32C", record)
		}
		event := &pb.TfEvent{}
		check(proto.Unmarshal(payload, event), fmt.Sprintf("events: record %d", record))
		if record == 0 && event.GetFileVersion() != "brain.Event:2" {
			fail("events: the first record is not brain.Event:2 but %v", event)
		}
		for _, v := range event.GetSummary().GetValue() {
			tags[v.Tag]++
		}
		offset = body + int(length) + 4
	}
	return tags
}

func main() {
	address := flag.String("address", "", "the coordinator, host:port")
	spec := flag.String("spec", "", "a job spec as JSON")
	checkpoint := flag.String("checkpoint_out", "", "where to write the job's last.ckpt")
	ca := flag.String("tls_ca", "",
		"with --tls_cert, --tls_key and --token: check a secured coordinator instead")
	cert := flag.String("tls_cert", "", "the client's certificate (PEM)")
	key := flag.String("tls_key", "", "the client's key (PEM)")
	token := flag.String("token", "", "the admin bearer token")
	hostile := flag.String("hostile", "",
		"with --address: random and unparsable input to every method there and at these "+
			"comma-separated addresses too")
	flag.Parse()
	if *address != "" && *hostile != "" {
		addresses := append([]string{*address}, strings.Split(*hostile, ",")...)
		report["hostile_codes"] = checkHostile(addresses, 12, 1)
		out, err := json.Marshal(report)
		check(err, "the report")
		fmt.Println(string(out))
		return
	}
	if *address != "" && *ca != "" {
		checkSecure(*address, *ca, *cert, *key, *token)
		out, err := json.Marshal(report)
		check(err, "the report")
		fmt.Println(string(out))
		return
	}
	if *address == "" || *spec == "" || *checkpoint == "" {
		fail("usage: go_client --address=HOST:PORT (--spec=JSON --checkpoint_out=FILE | " +
			"--tls_ca=PEM --tls_cert=PEM --tls_key=PEM --token=T)")
	}
	// grpc-go's defaults: 4 MiB receive limit, no keepalive, no retry policy.
	conn, err := grpc.Dial(*address, grpc.WithInsecure(), grpc.WithBlock(),
		grpc.WithTimeout(20*time.Second))
	check(err, "dial "+*address)
	defer conn.Close()

	checkHealth(conn)
	checkReflection(conn)
	checkWorkers(conn)
	checkGroup(conn)
	checkKeyValuePages(conn)
	checkUpload(conn)
	checkJob(conn, *spec, *checkpoint)

	out, err := json.Marshal(report)
	check(err, "the report")
	fmt.Println(string(out))
}
