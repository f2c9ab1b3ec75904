package log_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	clog "github.com/convlog/convlog/log"
	"github.com/convlog/convlog/log/record"
)

// admitMany admits one delivery to each of n instances of agent, from 64
// writers so that group commits carry them.
func admitMany(t testing.TB, db *clog.DB, agent string, n int) {
	t.Helper()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	next := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				key := record.Key{Agent: agent, Instance: fmt.Sprintf("inst-%05d", i), Session: record.DefaultSession}
				if _, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userEntry("hi")}}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// TestInstancesListing: newest activity first, paged, with every instance
// once; an admission moves its instance to the front.
func TestInstancesListing(t *testing.T) {
	db := openTestDB(t, nil)
	ctx := context.Background()
	admitMany(t, db, "a", 250)
	admitMany(t, db, "b", 3) // another agent's instances stay out
	key := record.Key{Agent: "a", Instance: "inst-00007", Session: "s2"}
	sub, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userEntry("later")}})
	if err != nil {
		t.Fatal(err)
	}
	var all []clog.InstanceInfo
	cursor := ""
	for pages := 0; ; pages++ {
		list, next, err := db.Instances(ctx, "a", cursor, 100)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, list...)
		if next == "" {
			if pages != 2 {
				t.Fatalf("%d pages", pages+1)
			}
			break
		}
		cursor = next
	}
	if len(all) != 250 || all[0].Instance != "inst-00007" || !slices.Equal(all[0].Sessions, []string{"default", "s2"}) || all[0].UID != sub.UID {
		t.Fatalf("%d instances, first %+v (uid %s)", len(all), all[0], sub.UID)
	}
	seen := map[string]bool{}
	if !sort.SliceIsSorted(all, func(i, j int) bool { return all[i].LastActivityAt.After(all[j].LastActivityAt) }) {
		t.Fatal("not newest first")
	}
	for _, in := range all {
		if seen[in.Instance] {
			t.Fatalf("%s twice", in.Instance)
		}
		seen[in.Instance] = true
	}
	if _, _, err := db.Instances(ctx, "a", "bm9wZQ", 10); !errors.Is(err, clog.ErrInvalidOffset) {
		t.Fatalf("bad cursor: %v", err)
	}
}

// TestInstancesListingCost lists the newest 100 of 10,000 instances, some
// of them with thousands of records, and reports the p50: the walk is over
// the activity index, so neither the number of instances nor that of
// records enters it. The figure is reported, not asserted: the machine is
// shared.
func TestInstancesListingCost(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 admissions")
	}
	db := openTestDB(t, nil)
	ctx := context.Background()
	admitMany(t, db, "a", 10_000)
	// Thousands of records in the newest instances: the page reads none.
	for i := range 5 {
		key := record.Key{Agent: "a", Instance: fmt.Sprintf("inst-%05d", i), Session: record.DefaultSession}
		recs := make([]record.Record, 1000)
		for j := range recs {
			recs[j] = userEntry("filler")
		}
		for range 3 {
			if _, err := db.Append(ctx, key, recs...); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{userEntry("now")}}); err != nil {
			t.Fatal(err)
		}
	}
	const runs = 200
	d := make([]time.Duration, runs)
	for i := range d {
		start := time.Now()
		list, _, err := db.Instances(ctx, "a", "", 100)
		d[i] = time.Since(start)
		if err != nil || len(list) != 100 {
			t.Fatalf("%d instances: %v", len(list), err)
		}
	}
	slices.Sort(d)
	t.Logf("list 100 of 10,000 instances: p50 %v, p99 %v (%d runs)", d[runs/2], d[runs*99/100], runs)
}

// BenchmarkInstancesList is the listing's cost at 10,000 instances.
func BenchmarkInstancesList(b *testing.B) {
	db := openTestDB(b, nil)
	admitMany(b, db, "a", 10_000)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := db.Instances(ctx, "a", "", 100); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAdmit is durable admission from 64 writers over 64 instances:
// what the instances index adds to each admission's transaction.
func BenchmarkAdmit(b *testing.B) {
	db := openTestDB(b, nil)
	ctx := context.Background()
	payload := benchPayload()
	runWriters(b, 64, func(w, _ int) error {
		key := record.Key{Agent: "bench", Instance: fmt.Sprintf("i%d", w), Session: "s"}
		_, _, err := db.Admit(ctx, clog.Admission{Key: key, Records: []record.Record{record.EntryRecord(record.Entry{Type: record.EntryUserMessage, Payload: payload})}})
		return err
	})
}

// InstancesVisible fills its pages with visible instances only, and walks
// at most MaxInstancesScan rows a page: a caller who may see one instance
// among many gets short pages, each of bounded cost, and then its own.
func TestInstancesVisible(t *testing.T) {
	db := openTestDB(t, nil)
	ctx := context.Background()
	admitMany(t, db, "a", clog.MaxInstancesScan+5)
	var walked int
	mine := func(name string) bool { walked++; return name == "inst-00000" || name == "inst-00003" }
	var got []string
	cursor := ""
	pages := 0
	for {
		walked = 0
		list, next, err := db.InstancesVisible(ctx, "a", cursor, 10, mine)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if walked > clog.MaxInstancesScan {
			t.Fatalf("page %d walked %d rows", pages, walked)
		}
		for _, in := range list {
			got = append(got, in.Instance)
		}
		if next == "" {
			break
		}
		cursor = next
	}
	slices.Sort(got)
	if fmt.Sprint(got) != "[inst-00000 inst-00003]" || pages != 2 {
		t.Errorf("listed %v in %d pages", got, pages)
	}
}
