package integration_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/testcontainers/testcontainers-go"

	"github.com/taskrun/taskrun"
	"github.com/taskrun/taskrun/config"
	"github.com/taskrun/taskrun/examples"
	"github.com/taskrun/taskrun/gateway"
	"github.com/taskrun/taskrun/internal/runtest"
	"github.com/taskrun/taskrun/internal/testdeadline"
	"github.com/taskrun/taskrun/persist"
	"github.com/taskrun/taskrun/workerclient"
	"github.com/taskrun/taskrun/workerclient/controlplanetest"
)

// IDs shared by the suite's runs; each test has a tenant of its own.
const (
	conversationID = "conv"
	taskID         = "task"
	sessionID      = "sess"
	bearerToken    = "integration-token"
	// labelTest marks the containers of one test.
	labelTest = "dev.taskrun.test"
)

// harness is one test's world: the end-to-end Env (a tenant, a run root,
// the S3 store, the Docker backend) and a control plane on a loopback port.
type harness struct {
	*runtest.Env
	t      *testing.T
	cp     *controlplanetest.ControlPlane
	client *workerclient.Client
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	tenant := "tenant-" + runtest.RandomID()
	labels := testcontainers.GenericLabels()
	maps.Copy(labels, map[string]string{labelSuite: suite.id, labelTest: tenant})
	env := runtest.New(t, runtest.Options{
		StoreURL: suite.storeURL, Tenant: tenant, Labels: labels, Logger: quietLogger,
		ConversationID: conversationID, TaskID: taskID, SessionID: sessionID,
	})
	require.NoError(t, env.Store.Ping(context.Background()))
	cp := controlplanetest.New(t, bearerToken)
	return &harness{Env: env, t: t, cp: cp, client: workerclient.New(cp.URL(), bearerToken)}
}

// quietLogger keeps the executor's own log out of the test output.
var quietLogger = slog.New(slog.DiscardHandler)

// shellRun is a run of a shell script in the testbox image.
func (h *harness) shellRun(runID, script string) taskrun.RunTaskInput {
	in := h.input(runID)
	in.Image = suite.testboxImage
	in.Command = []string{"sh", "-c", script}
	return in
}

// agentRun is a run of the reference agent on the demo workspace with the
// scripted demo model.
func (h *harness) agentRun(runID string) taskrun.RunTaskInput {
	in := h.input(runID)
	ws := filepath.Join(h.t.TempDir(), "ws")
	require.NoError(h.t, os.CopyFS(ws, examples.DemoWorkspace()))
	in.Task.WorkspaceDir = ws
	in.Task.Prompt = examples.DemoPrompt
	in.Image = suite.agentImage
	in.Model = config.ModelEntry{Provider: config.ProviderScripted, Name: gateway.DemoScriptName}
	return in
}

func (h *harness) input(runID string) taskrun.RunTaskInput {
	in := h.Input(runID, "")
	in.Updater, in.StreamSender = h.client, h.client.Stream()
	in.Logger = quietLogger
	return in
}

// run executes in. Its return value is deliberately dropped: the tests
// judge the run by what reached S3 and the control plane.
func (h *harness) run(in taskrun.RunTaskInput) {
	h.t.Helper()
	// A run here takes seconds; the deadline bounds one that hangs.
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(3*time.Minute))
	defer cancel()
	_ = taskrun.RunTask(ctx, in)
}

// patches returns the PATCH bodies the control plane applied for runID,
// requiring at least one.
func (h *harness) patches(runID string) []workerclient.PatchTaskRunRequest {
	h.t.Helper()
	ps := h.cp.Patches(runID)
	require.NotEmpty(h.t, ps, "no PATCH reached the control plane for %s", runID)
	return ps
}

// final is the last PATCH of runID.
func (h *harness) final(runID string) workerclient.PatchTaskRunRequest {
	ps := h.patches(runID)
	return ps[len(ps)-1]
}

// stream is runID's output as the control plane reassembled it; the stream
// must have been ended with a total equal to its length.
func (h *harness) stream(runID string) []byte {
	h.t.Helper()
	data, ended, total := h.cp.Stream(runID)
	assert.True(h.t, ended, "the stream of %s was ended", runID)
	assert.EqualValues(h.t, len(data), total, "the end marker's total matches the bytes received")
	return data
}

// runKey is the S3 key of one of runID's files.
func (h *harness) runKey(runID, name string) string {
	key, err := persist.RunKey(h.Ref(runID), name)
	require.NoError(h.t, err)
	return key
}

// runObject reads one of runID's files through the S3 API.
func (h *harness) runObject(runID, name string) []byte {
	return h.object(h.runKey(runID, name))
}

// object reads key through the S3 API.
func (h *harness) object(key string) []byte {
	h.t.Helper()
	out, err := suite.s3.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(s3Bucket), Key: aws.String(key)})
	require.NoError(h.t, err, "get s3://%s/%s", s3Bucket, key)
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	require.NoError(h.t, err)
	return data
}

// keys lists every key stored for the tenant, through the S3 API.
func (h *harness) keys() []string {
	h.t.Helper()
	var keys []string
	p := s3.NewListObjectsV2Paginator(suite.s3, &s3.ListObjectsV2Input{
		Bucket: aws.String(s3Bucket), Prefix: aws.String("tenants/" + h.Tenant + "/"),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(context.Background())
		require.NoError(h.t, err)
		for _, o := range page.Contents {
			keys = append(keys, aws.ToString(o.Key))
		}
	}
	return keys
}

// untar reads a stored tar.gz session state into a map of file contents.
func untar(t *testing.T, data []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(data))
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		require.NoError(t, err)
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[strings.TrimPrefix(path.Clean(hdr.Name), "./")] = string(body)
	}
}

// traceLine is one line of a run trace: either an agent event or a gateway
// exchange.
type traceLine struct {
	Event   string          `json:"event"`
	Data    json.RawMessage `json:"data"`
	Seq     *int64          `json:"seq"`
	Request json.RawMessage `json:"request"`
}

// parseTrace splits a JSONL trace, requiring every line to be JSON.
func parseTrace(t *testing.T, data []byte) []traceLine {
	t.Helper()
	var lines []traceLine
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var l traceLine
		require.NoError(t, json.Unmarshal(sc.Bytes(), &l), "trace line %q", sc.Text())
		lines = append(lines, l)
	}
	require.NoError(t, sc.Err())
	return lines
}

// containersWith lists the containers labelled key=value, as "id image".
func containersWith(ctx context.Context, key, value string) []string {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return []string{"docker client: " + err.Error()}
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, container.ListOptions{
		All: true, Filters: filters.NewArgs(filters.Arg("label", key+"="+value)),
	})
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	out := make([]string, len(list))
	for i, c := range list {
		out[i] = c.ID[:12] + " " + c.Image
	}
	return out
}

// suiteContainers lists this session's containers.
func suiteContainers(ctx context.Context) []string { return containersWith(ctx, labelSuite, suite.id) }
