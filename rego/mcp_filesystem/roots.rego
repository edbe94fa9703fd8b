# The directories the filesystem tools may touch: absolute, normalised, no trailing "/".
# This is the bundle's configuration (a file of its own so that a deployment, or a
# test, replaces it without touching the rules); its digest is part of the revision, so
# a changed root shows in every decision record. Keep it equal to (or inside) the
# directories the filesystem server itself is started with.
package cosigner.mcp_filesystem

roots := {"/srv/mcp"}
