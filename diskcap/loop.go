package diskcap

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// How an image is mounted. Mount and Reattach attach the image to a loop
// device and mount it with mount(2) in-process, which takes a fraction of
// the time mount(8) needs (a process of its own that reads the mount table
// and sets the device up the same way). Kernels before 5.8 have no
// LOOP_CONFIGURE; there mount(8) does it.

// mountOptions are the flags and ext4 data of one loop mount.
type mountOptions struct {
	readOnly bool
	flags    uintptr
	data     string
}

// String is the options as mount(8) takes them after -o.
func (o mountOptions) String() string {
	opts := []string{"loop"}
	if o.readOnly {
		opts = append(opts, "ro")
	}
	for _, f := range []struct {
		flag uintptr
		name string
	}{{unix.MS_NOSUID, "nosuid"}, {unix.MS_NODEV, "nodev"}, {unix.MS_NOEXEC, "noexec"}} {
		if o.flags&f.flag != 0 {
			opts = append(opts, f.name)
		}
	}
	if o.data != "" {
		opts = append(opts, o.data)
	}
	return strings.Join(opts, ",")
}

// mountImage mounts the ext4 image img on dir through a loop device that
// detaches itself once the mount is gone (or at once, when the mount
// fails). out is mount(8)'s output when it was used. Tests replace it.
var mountImage = func(img, dir string, o mountOptions) (out []byte, err error) {
	return mountVia(loopMount, img, dir, o)
}

// mountVia mounts img on dir with direct, or with mount(8) where the kernel
// lacks what direct needs.
func mountVia(direct func(img, dir string, o mountOptions) error, img, dir string, o mountOptions) ([]byte, error) {
	err := direct(img, dir, o)
	if errors.Is(err, errNoLoopConfigure) {
		return exec.Command("mount", "-t", "ext4", "-o", o.String(), img, dir).CombinedOutput()
	}
	return nil, err
}

// errMountRefused is wrapped by loopMount's error when the image was attached
// but mount(2) refused it: the image itself may be at fault, unlike a loop
// device that could not be had.
var errMountRefused = errors.New("the kernel refused to mount the image")

// errNoLoopConfigure is loopMount's error on a kernel without
// LOOP_CONFIGURE.
var errNoLoopConfigure = errors.New("the kernel has no LOOP_CONFIGURE")

// maxLoopAttempts bounds how often loopMount asks for a free loop device
// that another process then takes first.
const maxLoopAttempts = 16

// loopMount attaches img to a free auto-clearing loop device and mounts the
// device on dir. Its descriptors are closed on return: from then on the
// mount alone holds the device, so unmounting dir detaches it.
func loopMount(img, dir string, o mountOptions) error {
	mode, flags := os.O_RDWR, o.flags
	if o.readOnly {
		mode, flags = os.O_RDONLY, flags|unix.MS_RDONLY
	}
	backing, err := os.OpenFile(img, mode, 0)
	if err != nil {
		return err
	}
	defer backing.Close()
	dev, err := attachLoop(backing, o.readOnly)
	if err != nil {
		return err
	}
	defer dev.Close()
	if err := unix.Mount(dev.Name(), dir, "ext4", flags, o.data); err != nil {
		return fmt.Errorf("%w: mount %s (%s) on %s: %w", errMountRefused, dev.Name(), img, dir, err)
	}
	return nil
}

// attachLoop attaches backing to a free loop device, auto-clearing (and
// read-only with readOnly), and returns the open device.
func attachLoop(backing *os.File, readOnly bool) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	if readOnly {
		cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
	}
	for range maxLoopAttempts {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR, 0)
		if err != nil {
			return nil, err
		}
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		switch {
		case errors.Is(err, unix.EBUSY):
			// Another process attached it between GET_FREE and now.
		case errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL):
			return nil, fmt.Errorf("%w: %s: %w", errNoLoopConfigure, dev.Name(), err)
		default:
			return nil, fmt.Errorf("attach %s to %s: %w", backing.Name(), dev.Name(), err)
		}
	}
	return nil, fmt.Errorf("attach %s: every free loop device was taken by another process first (%d attempts)", backing.Name(), maxLoopAttempts)
}
