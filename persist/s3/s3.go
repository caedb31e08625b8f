// Package s3 is the s3:// driver of package persist: Amazon S3 or any
// S3-compatible server through gocloud's s3blob. Importing it (for its side
// effect, as a command's main does) makes persist.Open accept s3:// URLs;
// programs that store only to file:// or mem:// do not link the AWS SDK.
//
//	import _ "github.com/taskrun/taskrun/persist/s3"
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	gcaws "gocloud.dev/aws"
	"gocloud.dev/blob"
	"gocloud.dev/blob/s3blob"
	"gocloud.dev/gcerrors"

	"github.com/taskrun/taskrun/persist"
)

// Scheme is the URL scheme this driver registers.
const Scheme = "s3"

func init() {
	persist.RegisterScheme(Scheme, func(ctx context.Context, u *url.URL) (persist.Bucket, error) {
		b, err := openS3(ctx, u)
		if err != nil {
			return nil, err
		}
		return Bucket(b), nil
	})
}

// s3RequestAttempts and s3RequestMaxBackoff bound the AWS SDK's own retries
// of single requests (and of single parts of multipart uploads). The SDK
// default waits up to 20s between attempts; the store's retries of whole
// operations sit on top, so a down store is reported within seconds.
const (
	s3RequestAttempts   = 3
	s3RequestMaxBackoff = 250 * time.Millisecond
)

// openS3 opens an s3:// URL like gocloud's s3blob URL opener does, accepting
// the same query parameters, but with a bounded SDK retryer.
func openS3(ctx context.Context, u *url.URL) (*blob.Bucket, error) {
	q := u.Query()
	var bopts s3blob.Options
	var copts []func(*awss3.Options)

	if v := take(q, "ssetype"); v != "" {
		sse, err := parseSSEType(v)
		if err != nil {
			return nil, err
		}
		bopts.EncryptionType = sse
	}
	bopts.KMSEncryptionID = take(q, "kmskeyid")
	for _, b := range []struct {
		key string
		set func(*awss3.Options, bool)
	}{
		{"accelerate", func(o *awss3.Options, v bool) { o.UseAccelerate = v }},
		{"disable_https", func(o *awss3.Options, v bool) { o.EndpointOptions.DisableHTTPS = v }},
		{"use_path_style", func(o *awss3.Options, v bool) { o.UsePathStyle = v }},
		{"s3ForcePathStyle", func(o *awss3.Options, v bool) { o.UsePathStyle = v }},
	} {
		raw := take(q, b.key)
		if raw == "" {
			continue
		}
		v, err := strconv.ParseBool(raw)
		if err != nil {
			return nil, fmt.Errorf("s3 URL parameter %s=%q: use true or false", b.key, raw)
		}
		set := b.set
		copts = append(copts, func(o *awss3.Options) { set(o, v) })
	}

	cfg, err := gcaws.V2ConfigFromURLParams(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("s3 URL parameters: %w", err)
	}
	copts = append(copts, func(o *awss3.Options) {
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.MaxAttempts = s3RequestAttempts
			so.MaxBackoff = s3RequestMaxBackoff
			so.RateLimiter = ratelimit.None
		})
	})
	bopts.RequestChecksumCalculation = cfg.RequestChecksumCalculation
	return s3blob.OpenBucket(ctx, awss3.NewFromConfig(cfg, copts...), u.Host, &bopts)
}

// take removes key from q and returns its value.
func take(q url.Values, key string) string {
	v := q.Get(key)
	q.Del(key)
	return v
}

func parseSSEType(v string) (types.ServerSideEncryption, error) {
	var names []string
	for _, t := range types.ServerSideEncryptionAes256.Values() {
		if strings.EqualFold(string(t), v) {
			return t, nil
		}
		names = append(names, string(t))
	}
	return "", fmt.Errorf("s3 URL parameter ssetype=%q: use one of %s", v, strings.Join(names, ", "))
}

// Bucket is b as a persist.Bucket: the adapter between gocloud's blob API
// and the store's.
func Bucket(b *blob.Bucket) persist.Bucket { return gocloudBucket{b} }

// gocloudBucket is a *blob.Bucket as a persist.Bucket.
type gocloudBucket struct{ b *blob.Bucket }

func (g gocloudBucket) NewWriter(ctx context.Context, key string, opts persist.WriterOptions) (io.WriteCloser, error) {
	return g.b.NewWriter(ctx, key, &blob.WriterOptions{ContentType: opts.ContentType, Metadata: opts.Metadata})
}

func (g gocloudBucket) NewReader(ctx context.Context, key string) (io.ReadCloser, error) {
	return g.b.NewReader(ctx, key, nil)
}

func (g gocloudBucket) Attributes(ctx context.Context, key string) (persist.Attributes, error) {
	a, err := g.b.Attributes(ctx, key)
	if err != nil {
		return persist.Attributes{}, err
	}
	return persist.Attributes{Size: a.Size, ContentType: a.ContentType, Metadata: a.Metadata}, nil
}

func (g gocloudBucket) List(ctx context.Context, prefix, delimiter string) ([]persist.ListObject, error) {
	var out []persist.ListObject
	it := g.b.List(&blob.ListOptions{Prefix: prefix, Delimiter: delimiter})
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, persist.ListObject{Key: obj.Key, IsDir: obj.IsDir})
	}
}

func (g gocloudBucket) IsAccessible(ctx context.Context) (bool, error) { return g.b.IsAccessible(ctx) }

func (g gocloudBucket) Close() error { return g.b.Close() }

// ErrorCode maps gocloud's error codes to the store's.
func (g gocloudBucket) ErrorCode(err error) persist.ErrorCode {
	switch gcerrors.Code(err) {
	case gcerrors.Unknown:
		return persist.CodeUnknown
	case gcerrors.NotFound:
		return persist.CodeNotFound
	case gcerrors.Internal:
		return persist.CodeInternal
	case gcerrors.ResourceExhausted:
		return persist.CodeResourceExhausted
	case gcerrors.DeadlineExceeded:
		return persist.CodeDeadlineExceeded
	case gcerrors.InvalidArgument:
		return persist.CodeInvalidArgument
	default:
		return persist.CodeFailed
	}
}
