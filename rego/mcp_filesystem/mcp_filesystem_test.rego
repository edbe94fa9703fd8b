# Rego tests of the filesystem policy, run by `cosigner policy test` (and `opa test`).
# They call decide_in with their own roots instead of `with input as ...`.
package cosigner.mcp_filesystem_test

import data.cosigner.mcp_filesystem

roots := {"/data/root", "/srv/other"}

call(tool, args) := mcp_filesystem.decide_in({"tool": {"name": concat("", ["filesystem.", tool])}, "args": args}, roots)

effect(tool, path) := call(tool, {"path": path}).effect

test_reads_inside_each_root_allowed if {
	effect("read_text_file", "/data/root/a.txt") == "allow"
	effect("read_text_file", "/srv/other/deep/b.txt") == "allow"
	effect("list_directory", "/data/root") == "allow"
	effect("list_directory", "/data/root/") == "allow"
}

test_dot_dot_that_stays_inside_allowed if {
	effect("read_text_file", "/data/root/a/../b.txt") == "allow"
	effect("read_text_file", "/data/root/a/b/../../c") == "allow"
	effect("list_directory", "/data/root/a/..") == "allow"
}

test_traversal_out_of_the_root_denied if {
	every p in [
		"/data/root/../etc/passwd",
		"/data/root/..",
		"/data/root/a/../../etc/passwd",
		"/data/root/./../root/x",
		"/data/root//../x",
		"/data/root/a/../../../x",
	] {
		d := call("read_text_file", {"path": p})
		d.effect == "deny"
		d.reasons[0].code == "outside_root"
	}
}

test_paths_not_under_a_root_denied if {
	every p in ["/etc/passwd", "/data/rootx/a", "/data", "data/root/a", "", "~/a", "/data/root\u0000/a"] {
		effect("read_text_file", p) == "deny"
	}
}

test_non_string_or_missing_paths_denied if {
	call("read_text_file", {"path": 7}).effect == "deny"
	call("read_text_file", {}).effect == "deny"
	call("read_multiple_files", {"paths": "/data/root/a"}).effect == "deny"
	call("move_file", {"source": "/data/root/a"}).effect == "deny"
}

test_writes_need_one_maintainer if {
	every d in [
		call("write_file", {"path": "/data/root/a", "content": "x"}),
		call("edit_file", {"path": "/data/root/a", "edits": []}),
		call("create_directory", {"path": "/data/root/new"}),
		call("move_file", {"source": "/data/root/a", "destination": "/srv/other/a"}),
	] {
		d.effect == "require_approval"
		d.approval.require == [{"role": "maintainer", "count": 1}]
	}
}

test_writes_outside_denied if {
	call("write_file", {"path": "/data/root/../x", "content": "x"}).effect == "deny"
	call("move_file", {"source": "/etc/passwd", "destination": "/data/root/p"}).effect == "deny"
}

test_every_path_of_read_multiple_files_checked if {
	call("read_multiple_files", {"paths": ["/data/root/a", "/srv/other/b"]}).effect == "allow"
	call("read_multiple_files", {"paths": ["/data/root/a", "/data/root/../b"]}).effect == "deny"
}

test_other_tools_and_servers_denied if {
	call("delete_file", {"path": "/data/root/a"}).reasons[0].code == "tool_not_allowed"
	d := mcp_filesystem.decide_in({"tool": {"name": "git.read_text_file"}, "args": {"path": "/data/root/a"}}, roots)
	d.effect == "deny"
	mcp_filesystem.decide_in({}, roots).effect == "deny"
}
