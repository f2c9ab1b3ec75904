package record

import (
	"encoding/json"
	"testing"
)

func TestMarshalNoHTMLKeepsText(t *testing.T) {
	for _, s := range []string{
		"<a & b>", "line\u2028sep\u2029para", `back\u2028slash`, "\\\u2028", "\\", "\u2028", "plain",
	} {
		b, err := marshalNoHTML(s)
		if err != nil {
			t.Fatal(err)
		}
		var back string
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Fatalf("%q encoded as %s, decodes as %q (%v)", s, b, back, err)
		}
		want, _ := json.Marshal(s)
		if len(b) > len(want) || (len(s) > 0 && len(b) > len(s)*2+2) {
			t.Errorf("%q encoded as %s (%d bytes)", s, b, len(b))
		}
	}
	if b, _ := marshalNoHTML("\u2028<"); string(b) != "\"\u2028<\"" {
		t.Fatalf("%s", b)
	}
}
