package diskcap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Option adjusts a Mount.
type Option func(*mountConfig)

type mountConfig struct {
	templates string
	images    string
}

// WithTemplates formats the image by copying a pre-formatted image of the
// same size kept in dir (made there, once, on first use) instead of running
// mkfs.ext4 for every Mount: about a megabyte is copied instead of a
// process formatting two gigabytes, which takes most of the cap's time off
// the run's start. dir must be private to the executor (it is created mode
// 0700); the runs root's "diskcap" directory is meant. Every filesystem
// made from one template shares its UUID and directory hash seed, which no
// run can read (the image is the host's) and which matter only within the
// run's own filesystem. Unless WithImages says otherwise, the images
// themselves are kept in dir's "images" directory (see WithImages).
func WithTemplates(dir string) Option {
	return func(c *mountConfig) { c.templates = dir }
}

// templateVersion names the mkfs options of templateArgs: a change to them
// must change it, so that no host keeps using templates made otherwise.
const templateVersion = "2"

// BytesPerInode is the cap's inode ratio: one inode per 4 KiB block, so a
// workspace of small files runs out of bytes before it runs out of inodes
// (ext4's default of one per 16 KiB gives a 1 GiB cap only 65,536 inodes,
// fewer than a large repository's files). The inode tables take 1/16 of
// the cap.
const BytesPerInode = 4096

// mkfsArgs format an image for Mount: -m 0 reserves no blocks for root (the
// run gets its whole cap); -i sets BytesPerInode; nodiscard keeps the
// image's allocation (discarding punches holes in a file).
var mkfsArgs = []string{"-q", "-F", "-m", "0", "-i", strconv.Itoa(BytesPerInode), "-E", "nodiscard"}

// templateArgs format a template: Mount's options, with the inode tables
// and the journal left unwritten, so that the template's data is its
// metadata alone. The images copied from it read as zeros there, as a
// journal and inode tables zeroed by mkfs do.
var templateArgs = []string{"-q", "-F", "-m", "0", "-i", strconv.Itoa(BytesPerInode), "-E", "nodiscard,lazy_itable_init=1,lazy_journal_init=1"}

// format puts an empty ext4 filesystem in the allocated image img of size
// bytes: copied from the template in cfg.templates when there is one (it
// reports fromTemplate), else made by mkfs.ext4.
func format(ctx context.Context, cfg mountConfig, img string, size int64) (fromTemplate bool, err error) {
	if cfg.templates != "" {
		tmpl, err := template(ctx, cfg.templates, size)
		if err == nil {
			err = copyData(img, tmpl)
		}
		if err == nil {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("diskcap: %w", ctx.Err())
		}
		// A template that cannot be made or read costs its speed, not the cap.
	}
	return false, mkfs(ctx, img)
}

// mkfs formats img for Mount.
func mkfs(ctx context.Context, img string) error {
	args := append(append([]string{}, mkfsArgs...), img)
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("diskcap: mkfs.ext4: %w: %s", err, out)
	}
	return nil
}

// templatePath is where dir keeps the template of size bytes.
func templatePath(dir string, size int64) string {
	return filepath.Join(dir, "ext4-v"+templateVersion+"-"+strconv.FormatInt(size, 10)+".img")
}

// template returns the template of size bytes in dir, making it first if
// needed: formatted in a sparse temporary file, synced, then renamed into
// place, so that a template is whole or absent. Concurrent makers each
// rename a whole template; the last one stays.
func template(ctx context.Context, dir string, size int64) (string, error) {
	path := templatePath(dir, size)
	if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Size() == size {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("diskcap: template directory: %w", err)
	}
	removeStaleTemps(dir)
	f, err := os.CreateTemp(dir, ".ext4-*.tmp")
	if err != nil {
		return "", fmt.Errorf("diskcap: template: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("diskcap: template: %w", err)
	}
	args := append(append([]string{}, templateArgs...), tmp)
	if out, err := exec.CommandContext(ctx, "mkfs.ext4", args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("diskcap: template: mkfs.ext4: %w: %s", err, out)
	}
	if err := syncFile(tmp); err != nil {
		return "", fmt.Errorf("diskcap: template: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("diskcap: template: %w", err)
	}
	return path, nil
}

// staleTempAge is how old a temporary template must be to be another
// maker's leftover: formatting one takes well under a second.
const staleTempAge = 10 * time.Minute

// removeStaleTemps removes the temporary templates a maker that died left
// in dir.
func removeStaleTemps(dir string) {
	temps, _ := filepath.Glob(filepath.Join(dir, ".ext4-*.tmp"))
	for _, t := range temps {
		if fi, err := os.Lstat(t); err == nil && time.Since(fi.ModTime()) > staleTempAge {
			_ = os.Remove(t)
		}
	}
}

// dropTemplate removes a template an image was copied from that then failed
// to mount, so that the next Mount makes it again.
func dropTemplate(cfg mountConfig, size int64) {
	if cfg.templates != "" {
		_ = os.Remove(templatePath(cfg.templates, size))
	}
}

func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyData writes the data extents of the template tmpl into the image img,
// which is at least as large and reads as zeros everywhere else (it was just
// allocated), found with SEEK_DATA and SEEK_HOLE.
func copyData(img, tmpl string) (err error) {
	src, err := os.Open(tmpl)
	if err != nil {
		return fmt.Errorf("diskcap: template: %w", err)
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return fmt.Errorf("diskcap: template: %w", err)
	}
	dst, err := os.OpenFile(img, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("diskcap: image: %w", err)
	}
	defer func() {
		if cerr := dst.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("diskcap: image: %w", cerr)
		}
	}()
	fd := int(src.Fd())
	for off := int64(0); off < fi.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // no data past off
		}
		if err != nil {
			return fmt.Errorf("diskcap: template: seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("diskcap: template: seek hole: %w", err)
		}
		if _, err := io.Copy(io.NewOffsetWriter(dst, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return fmt.Errorf("diskcap: copy template: %w", err)
		}
		off = hole
	}
	return nil
}
