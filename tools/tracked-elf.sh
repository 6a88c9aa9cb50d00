#!/usr/bin/env bash
# make lint: fail on any tracked ELF file (a compiled binary committed by
# mistake) other than the committed eBPF objects bpf/*.o, which a clean
# `go build` needs (bpf2go's output, make check-generate).
set -euo pipefail
cd "$(dirname "$0")/.."
# One perl for all the files: the first four bytes of each, \x7fELF.
bad=$(git ls-files -z | perl -0ne '
	chomp;
	next if m{^bpf/[^/]+\.o$};
	open(my $fh, "<", $_) or next;
	my $magic = "";
	read($fh, $magic, 4);
	print "$_\n" if $magic eq "\x7fELF";
')
if [ -n "$bad" ]; then
	printf 'lint: %s is a tracked ELF file (a build output): git rm --cached it, .gitignore ignores it\n' $bad >&2
	exit 1
fi
