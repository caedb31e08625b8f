package diskcap

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Where a capped dir's image lives. The kernel shows every loop device's
// backing file path to every container on the host, in
// /sys/block/loop*/loop/backing_file; a path beside the run dir would name
// the run's tenant, conversation, task and run. So Mount keeps the image
// under an opaque random name in an images directory of the executor's
// (WithImages, or "images" in the WithTemplates directory), and records
// the mapping on the host's side only:
//
//   - beside the run dir, "."+base+".diskcap" holds the image's path, so
//     that Release, Detach and Reattach find it;
//   - beside the image, NAME.dir holds the run dir's path, so that an image
//     whose run dir is gone can be told apart and removed (SweepImages).
//
// Without an images directory the image is kept beside the run dir, as
// "."+base+".diskcap.img", whose path names whatever the run dir's does.

// WithImages keeps the image in dir (created mode 0700) under an opaque
// random name instead of beside the capped dir, so that no loop device's
// backing file path names the run. dir must be private to the executor and
// hold no tenant data in its own path; the runs root's "diskcap/images" is
// meant, which WithTemplates implies.
func WithImages(dir string) Option {
	return func(c *mountConfig) { c.images = dir }
}

// ImagesDirName is the images directory WithTemplates implies, inside the
// templates directory.
const ImagesDirName = "images"

// imagesDir is the directory Mount keeps images in, or "" for beside the
// capped dir.
func (c mountConfig) imagesDir() string {
	switch {
	case c.images != "":
		return c.images
	case c.templates != "":
		return filepath.Join(c.templates, ImagesDirName)
	}
	return ""
}

// refPath is the file beside dir that names its image.
func refPath(dir string) string {
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".diskcap")
}

// legacyImagePath is where an image is kept without an images directory.
func legacyImagePath(dir string) string {
	return filepath.Join(filepath.Dir(dir), "."+filepath.Base(dir)+".diskcap.img")
}

// ownerPath is the file beside img that names the dir it caps.
func ownerPath(img string) string {
	return strings.TrimSuffix(img, ".img") + ".dir"
}

// imagePath is where Mount keeps (or kept) the filesystem image for dir.
func imagePath(dir string) string {
	raw, err := os.ReadFile(refPath(dir))
	if img := string(raw); err == nil && filepath.IsAbs(img) && strings.HasSuffix(img, ".img") {
		return img
	}
	return legacyImagePath(dir)
}

// claimImage picks the image path of a new Mount of dir and records the
// mapping. It fails wrapping ErrInUse when another Mount holds dir.
func claimImage(cfg mountConfig, dir string) (string, error) {
	imgDir := cfg.imagesDir()
	if imgDir == "" {
		return legacyImagePath(dir), nil
	}
	if !filepath.IsAbs(imgDir) {
		return "", fmt.Errorf("diskcap: images directory %q must be an absolute path", imgDir)
	}
	if err := os.MkdirAll(imgDir, 0o700); err != nil {
		return "", fmt.Errorf("diskcap: images directory: %w", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("diskcap: %w", err)
	}
	var id [16]byte
	_, _ = rand.Read(id[:])
	img := filepath.Join(imgDir, hex.EncodeToString(id[:])+".img")
	ref, err := os.OpenFile(refPath(dir), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		// Another run is capping this dir: its image is not ours to remove.
		return "", fmt.Errorf("diskcap: %w: %s exists", ErrInUse, refPath(dir))
	}
	if err != nil {
		return "", fmt.Errorf("diskcap: record image: %w", err)
	}
	_, err = ref.WriteString(img)
	err = errors.Join(err, ref.Close(), os.WriteFile(ownerPath(img), []byte(abs), 0o600))
	if err != nil {
		forgetImage(dir, img)
		return "", fmt.Errorf("diskcap: record image: %w", err)
	}
	return img, nil
}

// forgetImage removes the records claimImage made of img for dir (not the
// image itself).
func forgetImage(dir, img string) {
	if img == legacyImagePath(dir) {
		return
	}
	_ = os.Remove(ownerPath(img))
	_ = os.Remove(refPath(dir))
}

// SweepImages removes, from the images directory dir, every image whose
// run dir no longer names it (the run dir and its record are gone, or
// belong to a later Mount) and which no loop device backs: what an
// executor that died between making an image and recording it, or between
// removing a run dir's record and its image, left behind. It returns the
// paths it removed.
func SweepImages(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("diskcap: sweep images: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".img") {
			continue
		}
		img := filepath.Join(dir, e.Name())
		if owner, err := os.ReadFile(ownerPath(img)); err == nil && imagePath(string(owner)) == img {
			continue // still its run dir's image
		}
		if backed, err := loopBacked(img); err != nil || backed {
			continue
		}
		if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		_ = os.Remove(ownerPath(img))
		removed = append(removed, img)
	}
	return removed, errors.Join(errs...)
}
