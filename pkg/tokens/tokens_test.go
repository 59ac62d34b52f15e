package tokens

import "testing"

func TestSet(t *testing.T) {
	s := NewSet([]string{" a-1 ", "", "b-2"})
	if len(s) != 2 {
		t.Fatalf("%d members, want 2 (the empty one skipped)", len(s))
	}
	for tok, want := range map[string]bool{"a-1": true, "b-2": true, "a-": false, "": false, " a-1 ": false} {
		if got := s.Has(Sum(tok)); got != want {
			t.Errorf("Has(%q) = %v, want %v", tok, got, want)
		}
	}
	if !Equal(Sum("x"), Sum("x")) || Equal(Sum("x"), Sum("y")) {
		t.Error("Equal disagrees with the tokens")
	}
	if (Set{}).Has(Sum("")) {
		t.Error("an empty set has a member")
	}
}
