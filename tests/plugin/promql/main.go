// promql-check loads Prometheus text scrapes into a real Prometheus TSDB through Prometheus's
// own text parser, the way a scrape does (job and instance labels added, one sample per
// scrape interval), then evaluates PromQL with Prometheus's engine and prints the results.
//
// Input (a JSON file named on the command line):
//
//	{"targets": [{"job": "...", "instance": "...", "text": "<exposition>"}],
//	 "scrapes": 21, "interval_s": 15,
//	 "queries": [{"id": "...", "expr": "..."}]}
//
// Output (stdout, JSON): {"results": [{"id": "...", "error": "...", "series": [{"labels": {...},
// "value": 1.5}]}]}, every query evaluated at the last scrape's time. A scrape that
// Prometheus's parser rejects ends the program with its error (exit 2).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/textparse"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/tsdb"
)

// The Content-Type the plugin's /metrics sends.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

type target struct {
	Job      string `json:"job"`
	Instance string `json:"instance"`
	Text     string `json:"text"`
}

type query struct {
	ID   string `json:"id"`
	Expr string `json:"expr"`
}

type input struct {
	Targets   []target `json:"targets"`
	Scrapes   int      `json:"scrapes"`
	IntervalS int      `json:"interval_s"`
	Queries   []query  `json:"queries"`
}

type series struct {
	Labels map[string]string `json:"labels"`
	Value  *float64          `json:"value"` // null for NaN or an infinity, which JSON cannot carry
}

type result struct {
	ID     string   `json:"id"`
	Error  string   `json:"error,omitempty"`
	Series []series `json:"series"`
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "promql-check: "+format+"\n", args...)
	os.Exit(code)
}

// load appends one scrape of a target at time t (ms), as Prometheus's scrape loop does.
func load(db *tsdb.DB, tg target, t int64) error {
	parser, err := textparse.New([]byte(tg.Text), contentType, labels.NewSymbolTable(), textparse.ParserOptions{})
	if parser == nil {
		return fmt.Errorf("no parser for %q: %v", contentType, err)
	}
	app := db.Appender(context.Background())
	var lset labels.Labels
	for {
		entry, err := parser.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			_ = app.Rollback()
			return fmt.Errorf("target %s: %w", tg.Instance, err)
		}
		if entry != textparse.EntrySeries {
			continue
		}
		_, _, value := parser.Series()
		parser.Labels(&lset)
		builder := labels.NewBuilder(lset)
		if lset.Has("job") || lset.Has("instance") {
			_ = app.Rollback()
			return fmt.Errorf("target %s: a series carries job or instance itself: %s", tg.Instance, lset)
		}
		builder.Set("job", tg.Job)
		builder.Set("instance", tg.Instance)
		if _, err := app.Append(0, builder.Labels(), t, value); err != nil {
			_ = app.Rollback()
			return fmt.Errorf("target %s: %s: %w", tg.Instance, lset, err)
		}
	}
	return app.Commit()
}

func main() {
	if len(os.Args) != 2 {
		fail(1, "usage: promql-check INPUT.json")
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fail(1, "%v", err)
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		fail(1, "%s: %v", os.Args[1], err)
	}
	if in.Scrapes < 1 || in.IntervalS < 1 {
		fail(1, "scrapes and interval_s must be at least 1")
	}
	dir, err := os.MkdirTemp("", "promql-check-")
	if err != nil {
		fail(1, "%v", err)
	}
	defer os.RemoveAll(dir)
	db, err := tsdb.Open(dir, nil, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		fail(1, "tsdb: %v", err)
	}
	defer db.Close()

	start := time.Unix(1_800_000_000, 0)
	interval := time.Duration(in.IntervalS) * time.Second
	for i := 0; i < in.Scrapes; i++ {
		at := start.Add(time.Duration(i) * interval).UnixMilli()
		for _, tg := range in.Targets {
			if err := load(db, tg, at); err != nil {
				fail(2, "scrape rejected: %v", err)
			}
		}
	}
	end := start.Add(time.Duration(in.Scrapes-1) * interval)

	engine := promql.NewEngine(promql.EngineOpts{
		MaxSamples:    50_000_000,
		Timeout:       time.Minute,
		LookbackDelta: 5 * time.Minute,
	})
	out := struct {
		Results []result `json:"results"`
	}{}
	for _, q := range in.Queries {
		res := result{ID: q.ID, Series: []series{}}
		qry, err := engine.NewInstantQuery(context.Background(), db, nil, q.Expr, end)
		if err != nil {
			res.Error = err.Error()
			out.Results = append(out.Results, res)
			continue
		}
		answer := qry.Exec(context.Background())
		if answer.Err != nil {
			res.Error = answer.Err.Error()
		} else {
			switch v := answer.Value.(type) {
			case promql.Vector:
				for _, sample := range v {
					res.Series = append(res.Series, series{Labels: sample.Metric.Map(), Value: finite(sample.F)})
				}
			case promql.Scalar:
				res.Series = append(res.Series, series{Labels: map[string]string{}, Value: finite(v.V)})
			default:
				res.Error = fmt.Sprintf("unexpected result type %s", answer.Value.Type())
			}
		}
		qry.Close()
		out.Results = append(out.Results, res)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail(1, "%v", err)
	}
}

func finite(f float64) *float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil
	}
	return &f
}
