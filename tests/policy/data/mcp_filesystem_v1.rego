# @modelcontextprotocol/server-filesystem behind cosigner-mcp-gate --server-name filesystem.
#
# Tools reach Cosigner as "filesystem.<tool>". Reads are allowed when every path argument
# is inside a root (roots.rego); writes (write_file, edit_file, create_directory,
# move_file) need one approval by role maintainer under the same condition; a path
# outside every root, a relative path and any other tool are denied.
#
# Paths are judged as text, normalised here rather than trusted: a path must start with
# "<root>/" (or be the root), and after dropping "" and "." segments the ".." segments
# may never climb above the root at any point, so "<root>/../etc/passwd" and
# "<root>/a/../../etc" are outside, "<root>/a/../b" is inside. A path that only reaches
# the root by climbing out and back ("<root>/../mcp/x") is refused too: refusing is the
# safe side. Symbolic links cannot be seen from here; the filesystem server resolves
# them and refuses targets outside its own allowed directories, which is why it must be
# started with the same roots.
#
# The logic is a function, decide_in(inp, roots), so tests pass their own roots without
# `with` (rego-cpp 1.5.2 aborts on `with input as ...` over dependent rules).
package cosigner.mcp_filesystem

default decision := {"effect": "deny", "reasons": [{"code": "tool_not_allowed", "message": "tool is not allowed"}]}

decision := decide_in({"tool": input.tool, "args": input.args}, roots)

server := "filesystem"

read_tools := {
	"read_text_file", "read_file", "read_media_file", "read_multiple_files",
	"list_directory", "list_directory_with_sizes", "directory_tree", "search_files",
	"get_file_info", "list_allowed_directories",
}

write_tools := {"write_file", "edit_file", "create_directory", "move_file"}

maintainer_approval := {
	"require": [{"role": "maintainer", "count": 1}],
	"timeout_ms": 900000,
	"distinct_from": "initiator",
}

decide_in(inp, rs) := {"effect": "allow", "reasons": [{"code": "read_inside_root", "message": "read inside an allowed root"}]} if {
	t := tool_of(inp.tool.name)
	t in read_tools
	all_inside(paths_of(t, inp.args), rs)
} else := {
	"effect": "require_approval",
	"reasons": [{"code": "write_needs_maintainer", "message": "writes inside an allowed root need a maintainer's approval"}],
	"approval": maintainer_approval,
} if {
	t := tool_of(inp.tool.name)
	t in write_tools
	all_inside(paths_of(t, inp.args), rs)
} else := {"effect": "deny", "reasons": [{"code": "outside_root", "message": "every path must be absolute and inside an allowed root"}]} if {
	tool_of(inp.tool.name) in (read_tools | write_tools)
} else := {"effect": "deny", "reasons": [{"code": "tool_not_allowed", "message": "tool is not allowed"}]}

# "filesystem.read_file" -> "read_file"; undefined for another server's tools.
tool_of(name) := substring(name, count(server) + 1, -1) if {
	is_string(name)
	startswith(name, concat("", [server, "."]))
}

# The path arguments of each tool; undefined (so: denied) when one is missing.
paths_of("list_allowed_directories", _) := []

paths_of("read_multiple_files", args) := args.paths

paths_of("move_file", args) := [args.source, args.destination]

paths_of(t, args) := [args.path] if {
	not t in {"list_allowed_directories", "read_multiple_files", "move_file"}
}

all_inside(ps, rs) if {
	is_array(ps)
	every p in ps {
		inside(p, rs)
	}
}

inside(p, rs) if {
	is_string(p)
	not contains(p, "\u0000")
	some r in rs
	stays_inside(below(p, r))
}

# What follows the root in p ("" for the root itself); undefined when p is not under r.
below(p, r) := "" if p == r

below(p, r) := substring(p, count(r) + 1, -1) if startswith(p, concat("", [r, "/"]))

stays_inside(rest) if {
	segs := [s | some s in split(rest, "/"); s != ""; s != "."]
	every i, _ in segs {
		depth(segs, i) >= 0
	}
}

# Directory depth below the root after segments 0..i ("name" +1, ".." -1).
depth(segs, i) := count([j | s := segs[j]; j <= i; s != ".."]) - count([j | s := segs[j]; j <= i; s == ".."])
