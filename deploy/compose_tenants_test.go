package deploy

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/hermes-mobile/gateway/pkg/tenant"
)

// composeOwners are the owners of docker-compose.yml's tenants file.
var composeOwners = []string{"acme", "beta"}

// TestComposeOwners: every edge and the router of docker-compose.yml read
// the same tenants file (MOBILE_TENANTS_FILE) from a directory mounted
// read-only (a file mounted alone keeps its old content when an editor
// replaces it), whose default is deploy/tenants; that file parses with
// pkg/tenant and holds two owners, each with an app, a deliver and an
// agent key, marked as secrets for trying it out; and every credential
// the README and the file itself give for them is one of the file's keys.
func TestComposeOwners(t *testing.T) {
	c := loadCompose(t)
	var mount string
	for _, name := range []string{"edge1", "edge2", "router"} {
		s := c.Services[name]
		file, _ := s.env("MOBILE_TENANTS_FILE")
		if file == "" {
			t.Fatalf("%s: no MOBILE_TENANTS_FILE", name)
		}
		var found bool
		for _, v := range s.Volumes {
			src, dst, mode := splitVolume(interpolate(v))
			if path.Dir(file) != dst {
				continue
			}
			found = true
			if mode != "ro" {
				t.Errorf("%s mounts %q: want it read-only (:ro)", name, v)
			}
			if mount != "" && v != mount {
				t.Errorf("%s mounts %q, another service %q: every node must read the same file", name, v, mount)
			}
			mount = v
			if !strings.HasPrefix(src, "./") {
				t.Errorf("%s mounts %q: want a directory of the repository by default", name, src)
			}
		}
		if !found {
			t.Fatalf("%s: MOBILE_TENANTS_FILE=%s, but no volume mounts its directory %s (%v)", name, file, path.Dir(file), s.Volumes)
		}
	}
	if !strings.Contains(mount, "${HERMES_TENANTS_DIR:-") {
		t.Errorf("the tenants mount %q: want its source ${HERMES_TENANTS_DIR:-…}, so an operator gives its own", mount)
	}

	src, _, _ := splitVolume(interpolate(mount))
	file, _ := c.Services["edge1"].env("MOBILE_TENANTS_FILE")
	local := filepath.Join(root, filepath.FromSlash(src), path.Base(file))
	if fi, err := os.Stat(filepath.Join(root, filepath.FromSlash(src))); err != nil || !fi.IsDir() {
		t.Fatalf("the tenants mount's source %s: want a directory (%v)", src, err)
	}
	reg, err := tenant.Open(tenant.Options{Path: local})
	if err != nil {
		t.Fatal(err)
	}
	snap := reg.Snapshot()
	var ids []string
	for _, o := range snap.Tenants {
		ids = append(ids, o.ID)
		var kinds []string
		for _, k := range o.Keys {
			kinds = append(kinds, string(k.Kind))
		}
		slices.Sort(kinds)
		if want := []string{"agent", "app", "deliver"}; !slices.Equal(kinds, want) {
			t.Errorf("owner %s has keys of kinds %v, want %v", o.ID, kinds, want)
		}
	}
	if !slices.Equal(ids, composeOwners) {
		t.Fatalf("%s holds owners %v, want %v", local, ids, composeOwners)
	}
	raw, err := os.ReadFile(local)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "FOR TRYING IT OUT ONLY") {
		t.Errorf("%s does not say its plain secrets are only for trying it out", local)
	}

	// The credentials the README's curls and the file's own list give are
	// the file's keys, and the README names each owner's cron and phones.
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	credential := regexp.MustCompile(`hmt_[a-z0-9-]+\.[a-z0-9-]+\.[A-Za-z0-9_-]+`)
	for where, text := range map[string]string{"README.md": string(readme), local: string(raw)} {
		creds := credential.FindAllString(text, -1)
		for _, cr := range creds {
			if _, ok := snap.Verify(cr); !ok {
				t.Errorf("%s gives %s, which is not a key of %s", where, cr, local)
			}
		}
		for _, owner := range composeOwners {
			for _, key := range []string{"app", "cron"} {
				if !slices.ContainsFunc(creds, func(c string) bool { return strings.HasPrefix(c, "hmt_"+owner+"."+key+".") }) {
					t.Errorf("%s gives no credential of %s's %s key", where, owner, key)
				}
			}
		}
	}
}

// splitVolume takes a short-syntax volume "source:target[:mode]" apart.
func splitVolume(v string) (src, dst, mode string) {
	parts := strings.Split(v, ":")
	if len(parts) >= 2 {
		src, dst = parts[0], parts[1]
	}
	if len(parts) >= 3 {
		mode = parts[2]
	}
	return src, dst, mode
}
