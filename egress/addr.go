package egress

import (
	"net/netip"
)

// special address ranges the proxy refuses unless a rule names the address.
var (
	cgnat = netip.MustParsePrefix("100.64.0.0/10")
	// metadata lists cloud instance-metadata endpoints outside the
	// link-local ranges (which are refused as a class anyway).
	metadata = []netip.Prefix{
		netip.MustParsePrefix("169.254.169.254/32"), // AWS, GCP, Azure, ...
		netip.MustParsePrefix("169.254.170.2/32"),   // AWS ECS task metadata
		netip.MustParsePrefix("fd00:ec2::254/128"),  // AWS IPv6
		netip.MustParsePrefix("100.100.100.200/32"), // Alibaba Cloud
		netip.MustParsePrefix("192.0.0.192/32"),     // Oracle Cloud
	}
	// otherReserved are ranges no public service lives in.
	otherReserved = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),
		netip.MustParsePrefix("192.0.0.0/24"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("198.18.0.0/15"),
		netip.MustParsePrefix("198.51.100.0/24"),
		netip.MustParsePrefix("203.0.113.0/24"),
		netip.MustParsePrefix("240.0.0.0/4"),
		netip.MustParsePrefix("64:ff9b:1::/48"),
		netip.MustParsePrefix("100::/64"),
		netip.MustParsePrefix("2001:db8::/32"),
	}
)

// addressClass names why an address is special, or returns "" for an
// ordinary public unicast address.
func addressClass(a netip.Addr) string {
	a = a.Unmap()
	for _, p := range metadata {
		if p.Contains(a) {
			return "cloud metadata"
		}
	}
	switch {
	case !a.IsValid():
		return "invalid"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "multicast"
	case cgnat.Contains(a):
		return "carrier-grade NAT"
	case a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast"
	}
	if a.Is6() {
		// IPv4-compatible, NAT64 and 6to4 forms can smuggle a refused IPv4 address.
		if p := netip.MustParsePrefix("::/96"); p.Contains(a) {
			return "IPv4-compatible IPv6"
		}
		if p := netip.MustParsePrefix("64:ff9b::/96"); p.Contains(a) {
			return "NAT64"
		}
		if p := netip.MustParsePrefix("2002::/16"); p.Contains(a) {
			return "6to4"
		}
	}
	for _, p := range otherReserved {
		if p.Contains(a) {
			return "reserved"
		}
	}
	return ""
}
