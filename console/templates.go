package console

import (
	"fmt"
	"html/template"
	"net/url"
	"strings"
	"time"
)

// pageNames are the templates/NAME.html files, each rendered inside
// templates/layout.html.
var pageNames = []string{"error", "login", "overview", "letters", "letter", "replay", "outbox", "consumers", "consumer",
	"idemhttp", "audit"}

var funcs = template.FuncMap{
	// path joins the base path and escaped path segments.
	"path": func(base string, segs ...any) string {
		var b strings.Builder
		b.WriteString(base)
		for _, s := range segs {
			b.WriteString("/")
			b.WriteString(url.PathEscape(fmt.Sprint(s)))
		}
		return b.String()
	},
	"time": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"timep": func(t *time.Time) string {
		if t == nil || t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05Z")
	},
	"secs": func(s any) string {
		switch v := s.(type) {
		case *float64:
			if v == nil {
				return "-"
			}
			return secs(*v).String()
		case float64:
			return secs(v).String()
		}
		return fmt.Sprint(s)
	},
	"int64p": func(p *int64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprint(*p)
	},
	"states": statesText,
	"add":    func(a, b int) int { return a + b },
	"list":   func(s ...string) []string { return s },
}

func parsePages() (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}
