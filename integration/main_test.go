package integration_test

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/docker/docker/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/taskrun/taskrun/images"
	"github.com/taskrun/taskrun/integration/taskruntest"
	"github.com/taskrun/taskrun/internal/testdeadline"
	// The suite's store is s3://, opened with persist.Open.
	_ "github.com/taskrun/taskrun/persist/s3"
	"github.com/taskrun/taskrun/sandbox"
)

// The S3 server's account, bucket and region.
const (
	s3AccessKey = "integration-access"
	s3SecretKey = "integration-secret-key"
	s3Bucket    = "taskrun-integration"
	s3Region    = "us-east-1"
	s3Port      = "7070/tcp"
	versitygw   = "github.com/versity/versitygw/cmd/versitygw@v1.8.0"
)

// versitygwDockerfile runs versitygw's posix backend on /data. WORKDIR
// creates the directories a scratch image lacks.
const versitygwDockerfile = `FROM scratch
COPY versitygw /usr/local/bin/versitygw
WORKDIR /tmp
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/versitygw"]
`

// labelSuite marks every container this suite creates, so that it removes
// exactly its own and can prove that nothing was left.
const labelSuite = "dev.taskrun.integration"

// suite is what TestMain set up for every test.
var suite struct {
	// id is the value of labelSuite on this session's containers.
	id string
	// agentImage and testboxImage are session builds of taskrun's images.
	agentImage, testboxImage string
	// storeURL opens the S3 bucket with persist.Open.
	storeURL string
	// s3 is a plain S3 client on the same bucket, for checking what was stored.
	s3 *s3.Client
}

func TestMain(m *testing.M) {
	if os.Getenv("TESTCONTAINERS_RYUK_DISABLED") == "" {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
	}
	flag.Parse()
	if testing.Short() {
		fmt.Println("integration: end-to-end suites skipped in -short mode")
		os.Exit(0)
	}
	suite.id = "it-" + strings.ToLower(rand.Text()[:10])
	if err := reachPublishedPortsLocally(); err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		os.Exit(1)
	}
	code, err := runSuite(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration:", err)
		code = 1
	}
	os.Exit(code)
}

// runSuite builds the images, starts the S3 server, runs the tests and
// removes everything it created.
//
// The set-up and the clean-up each have their own deadline, scaled to the
// machine's speed; the tests between them are bounded by go test -timeout.
func runSuite(m *testing.M) (code int, err error) {
	// Compiling the agent and versitygw, building three images and starting
	// the S3 server take a few minutes on an idle 2-core machine; the
	// deadline only bounds a build or a start that is stuck.
	ctx, cancel := context.WithTimeout(context.Background(), testdeadline.Scale(10*time.Minute))
	defer cancel()
	binDir, err := os.MkdirTemp("", "taskrun-integration-bin-")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(binDir)

	// Removing the images and the S3 server takes seconds; the deadline
	// bounds an engine that stopped answering.
	cleanup := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), testdeadline.Scale(2*time.Minute))
	}
	built, err := buildImages(ctx, binDir)
	defer func() {
		ctx, cancel := cleanup()
		defer cancel()
		for _, img := range built {
			err = errors.Join(err, img.Remove(ctx))
		}
	}()
	if err != nil {
		return 1, err
	}
	stop, err := startS3(ctx, built[2].Ref)
	defer func() { err = errors.Join(err, stop()) }()
	if err != nil {
		return 1, err
	}
	code = m.Run()
	ctx, cancel = cleanup()
	defer cancel()
	if err := checkNothingLeft(ctx); err != nil {
		return 1, err
	}
	return code, nil
}

// reachPublishedPortsLocally points testcontainers at localhost for
// published ports when the engine runs on this very host. testcontainers
// guesses "inside a container" from /.dockerenv and would dial the default
// gateway instead, which is wrong on a VM image that carries that file.
// An explicit TESTCONTAINERS_HOST_OVERRIDE is left alone.
func reachPublishedPortsLocally() error {
	if _, set := os.LookupEnv("TESTCONTAINERS_HOST_OVERRIDE"); set {
		return nil
	}
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return fmt.Errorf("docker client: %w", err)
	}
	defer cli.Close()
	info, err := cli.Info(context.Background())
	if err != nil {
		return fmt.Errorf("docker info: %w (is the engine running? check DOCKER_HOST)", err)
	}
	if host, err := os.Hostname(); err == nil && host == info.Name {
		os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "localhost")
	}
	return nil
}

// buildImages builds the agent, the testbox and the S3 server images; on
// error it returns those it built, for removal.
func buildImages(ctx context.Context, binDir string) ([]*taskruntest.Image, error) {
	if _, err := taskruntest.BuildStatic(ctx, binDir, "github.com/taskrun/taskrun/cmd/taskrun-agent"); err != nil {
		return nil, err
	}
	gw, err := taskruntest.BuildStatic(ctx, binDir, versitygw)
	if err != nil {
		return nil, err
	}
	agentDef, err := images.Agent(binDir)
	if err != nil {
		return nil, err
	}
	testboxDef, err := images.Testbox()
	if err != nil {
		return nil, err
	}
	var built []*taskruntest.Image
	for _, build := range []func() (*taskruntest.Image, error){
		func() (*taskruntest.Image, error) {
			return taskruntest.BuildDefinition(ctx, "taskrun-integration/agent", agentDef)
		},
		func() (*taskruntest.Image, error) {
			return taskruntest.BuildDefinition(ctx, "taskrun-integration/testbox", testboxDef)
		},
		func() (*taskruntest.Image, error) {
			return taskruntest.BuildImage(ctx, taskruntest.ImageSource{
				Repo: "taskrun-integration/versitygw", Dockerfile: versitygwDockerfile,
				Files: map[string]string{"versitygw": gw},
			})
		},
	} {
		img, err := build()
		if err != nil {
			return built, err
		}
		built = append(built, img)
	}
	suite.agentImage, suite.testboxImage = built[0].Ref, built[1].Ref
	return built, nil
}

// startS3 starts versitygw from image, creates the bucket and points the AWS
// SDK's default credential chain (used by persist's s3:// store) at it.
func startS3(ctx context.Context, image string) (stop func() error, err error) {
	c, err := testcontainers.Run(ctx, image,
		testcontainers.WithCmd("--port", ":7070", "posix", "/data"),
		testcontainers.WithEnv(map[string]string{"ROOT_ACCESS_KEY_ID": s3AccessKey, "ROOT_SECRET_ACCESS_KEY": s3SecretKey}),
		testcontainers.WithExposedPorts(s3Port),
		testcontainers.WithLabels(map[string]string{sandbox.LabelManaged: "true", labelSuite: suite.id}),
		testcontainers.WithWaitStrategy(wait.ForHTTP("/").WithPort(s3Port).
			WithStatusCodeMatcher(func(int) bool { return true }).WithStartupTimeout(time.Minute)),
	)
	stop = func() error { return testcontainers.TerminateContainer(c) }
	if err != nil {
		return stop, fmt.Errorf("start S3 server: %w", err)
	}
	endpoint, err := c.PortEndpoint(ctx, s3Port, "http")
	if err != nil {
		return stop, fmt.Errorf("S3 server endpoint: %w", err)
	}
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": s3AccessKey, "AWS_SECRET_ACCESS_KEY": s3SecretKey, "AWS_SESSION_TOKEN": "",
		"AWS_PROFILE": "", "AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		os.Setenv(k, v)
	}
	suite.s3 = s3.New(s3.Options{
		Region:       s3Region,
		BaseEndpoint: aws.String(endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(s3AccessKey, s3SecretKey, ""),
	})
	if _, err := suite.s3.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(s3Bucket)}); err != nil {
		return stop, fmt.Errorf("create bucket: %w", err)
	}
	suite.storeURL = fmt.Sprintf("s3://%s?endpoint=%s&region=%s&use_path_style=true", s3Bucket, endpoint, s3Region)
	return stop, nil
}

// checkNothingLeft fails when a run container of this session outlived its
// test. Only the S3 server may still be there.
func checkNothingLeft(ctx context.Context) error {
	var left []string
	for _, c := range suiteContainers(ctx) {
		if !strings.Contains(c, "versitygw") {
			left = append(left, c)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("containers left behind: %s", strings.Join(left, ", "))
	}
	return nil
}
